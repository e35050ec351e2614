"""bench/serve_latency.py counts a real engine's requests from llama-server's own log lines
(`--engine-log`): a request finished, one cancelled while a slot worked on it, one cancelled
before a slot took it, and only the lines a run added to the log."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# llama-server's lines (llama.cpp of llama-cpp-python 0.3.36), as its log holds them
EARLIER = """\
0.14.078.431 I slot launch_slot_: id  3 | task 0 | processing task, is_child = 0
0.37.293.709 I slot print_timing: id  3 | task 0 |    graphs reused =        180
0.37.293.853 I slot      release: id  3 | task 0 | stop processing: n_tokens = 1217, truncated = 0
"""
RUN = """\
4.04.612.185 I slot launch_slot_: id  0 | task 930 | processing task, is_child = 0
4.04.613.001 I slot launch_slot_: id  1 | task 931 | processing task, is_child = 0
4.05.535.181 W srv          stop: cancel task, id_task = 930
4.06.101.377 I slot      release: id  1 | task 931 | stop processing: n_tokens = 1215, truncated = 0
4.08.563.032 I slot      release: id  0 | task 930 | stop processing: n_tokens = 1173, truncated = 0
7.04.585.177 W srv          stop: cancel task, id_task = 1991
7.05.000.000 I slot launch_slot_: id  2 | task 1992 | processing task, is_child = 0
"""


def _bench():
    spec = importlib.util.spec_from_file_location("serve_latency", REPO / "bench/serve_latency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.time.sleep = lambda seconds: None  # the wait for the engine's last lines
    return module


def test_a_runs_requests_are_counted_from_the_engines_log_lines_it_added(tmp_path):
    bench = _bench()
    log = tmp_path / "llama-server.log"
    log.write_text(EARLIER + RUN)
    seen = bench.engine_seen(log, len(EARLIER.encode()), delivered_steps=1)
    assert seen == {
        "judge_started": 3,  # 930, 931 and 1992 (still at work when the run ended)
        "judge_finished": 1,  # 931
        "judge_cancelled": 1,  # 930, cancelled while its slot worked on it
        "judge_cancelled_queued": 1,  # 1991, before a slot took it
        "finished_used": 1.0,
    }
    assert bench.engine_seen(log, 0, delivered_steps=1)["judge_finished"] == 2  # task 0 too
