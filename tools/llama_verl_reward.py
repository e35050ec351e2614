"""veRL's reward loop against a served student: veRL's own `RewardLoopWorker` (custom reward
function `serving/verl.py`) with the address of veRL's own `NaiveRouter` in front of the
student's server (llama-server in `tools/llama_student_check.sh`), beside the rewards of the
in-process student's verdicts, trace by trace.

    python tools/llama_verl_reward.py BUNDLE POLICY_TOKENIZER SERVER_URL IN_PROCESS_VERDICTS \
        [MAX_TOKENS]
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    bundle, policy, server, verdicts_path = sys.argv[1:5]
    max_tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 768
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.experimental.reward_loop.router.naive_router import NaiveRouter

    from stepgap.io import read_models
    from stepgap.schema import Verdict
    from stepgap.segment import iter_traces
    from stepgap.serving import StepGapReward
    from tests.fixtures.live_server import LiveServer
    from tests.serving.test_interop_verl import batch

    traces = list(iter_traces(REPO / "examples" / "traces.jsonl"))
    reward_json = Path(tempfile.mkdtemp()) / "reward.json"
    reward_json.write_text(
        json.dumps({"bundle": bundle, "no_cache": True, "max_tokens": max_tokens})
    )
    config = OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": policy, "tokenizer_path": None}},
        "reward": {
            "custom_reward_function": {
                "path": str(REPO / "serving" / "verl.py"), "name": "compute_score",
                "reward_kwargs": {"config": str(reward_json), "served_model": "stepgap-student"},
            },
            "reward_manager": {"source": "register", "name": "naive", "module": None},
            "reward_model": {"enable": True, "model_path": str(Path(bundle) / "student"),
                             "rollout": {"name": "vllm"}},
            "reward_kwargs": {},
            "sandbox_fusion": None,
        },
    })  # fmt: skip
    with LiveServer(NaiveRouter([server.removesuffix("/v1")]).app) as router:
        worker = RewardLoopWorker(config, router.removeprefix("http://"))
        data = batch(traces, AutoTokenizer.from_pretrained(policy))

        async def score_all():
            return await asyncio.gather(
                *(worker.compute_score(data[i : i + 1]) for i in range(len(data)))
            )

        served = [out["reward_score"] for out in worker.loop.run_until_complete(score_all())]
        print(f"   veRL router at {router}, forwarding to {server}")
    by_trace: dict[str, list[Verdict]] = {}
    for _, v in read_models(verdicts_path, Verdict):
        by_trace.setdefault(v.trace_id, []).append(v)
    reward = StepGapReward(None)
    local = [reward.result(t, by_trace.get(t.id, [])).reward for t in traces]
    same = 0
    print(f"   {'trace':<28} {'veRL + served':>14} {'in-process':>11}")
    for t, a, b in zip(traces, served, local, strict=True):
        same += abs(a - b) < 1e-9
        print(f"   {t.id:<28} {a:>14.3f} {b:>11.3f}{'' if abs(a - b) < 1e-9 else '   differs'}")
    print(f"   {same} of {len(traces)} rewards the same")


if __name__ == "__main__":
    main()
