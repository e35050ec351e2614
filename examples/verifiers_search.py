"""Search rollouts rewarded by stepgap, run by verifiers' own eval (`vf-eval stepgap-search`).

Start first, each in its own shell:

    vllm serve Qwen/Qwen2.5-7B-Instruct --port 8001 \
        --enable-auto-tool-choice --tool-call-parser hermes      # the policy (tool calls)
    stepgap serve-index wiki_index --port 8000                   # the retriever (/retrieve)
    stepgap serve --bundle bundle --port 8080                    # the reward (or --reward-config)

then

    python examples/verifiers_search.py --model Qwen/Qwen2.5-7B-Instruct \
        --base-url http://127.0.0.1:8001/v1 --retriever-url http://127.0.0.1:8000/retrieve \
        --reward-url http://127.0.0.1:8080 -n 5

which is `vf-eval stepgap-search -m MODEL --client.base-url URL --env.taskset.qa FILE
--env.taskset.task.retriever-url URL --env.taskset.task.url URL --no-push --no-rich -n 5`:
each question of the QA file (`question`, `golden_answers`) is a task with Search-R1's
tool-calling prompt, each `search` call asks the retriever, and each rollout's reward is the
typed stepgap reward of its text. A rollout whose steps could not all be checked is reported
as errored (no reward), never as 0. The run's traces are in OUTPUT/RUN/traces.jsonl.

Needs `pip install "stepgap[teacher,serve,retrieval]" "verifiers>=0.4,<0.5"` and the
environment's name (`pip install ./environments/stepgap_search`; from a checkout it is found
without).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def vf_eval_args(a: argparse.Namespace) -> list[str]:
    """The `vf-eval` command line these options make."""
    args = ["stepgap-search", "-m", a.model, "--client.base-url", a.base_url,
            "--env.taskset.qa", a.questions, "--env.taskset.task.retriever-url", a.retriever_url,
            "--env.taskset.task.topk", str(a.topk), "-n", str(a.n), "-r", str(a.r),
            "-o", a.output, "--run.name", a.run, "--no-push", "--no-rich"]  # fmt: skip
    if a.reward_url:
        args += ["--env.taskset.task.url", a.reward_url]
    if a.reward_config:
        args += ["--env.taskset.task.config", a.reward_config]
    if a.feedback:
        args += ["--env.taskset.task.feedback", a.feedback]
    return args


def summary(traces_file: Path) -> list[dict]:
    """Each rollout's question, reward (None: no reward) and why there is none."""
    rows = []
    for line in traces_file.read_text(encoding="utf-8").splitlines():
        for t in json.loads(line)["traces"]:
            reward = (t["rewards"].get("stepgap") or {}).get("score")
            why = "; ".join(e["message"] for e in t["errors"]) if not t["ok"] else None
            rows.append({"question": t["task"]["data"]["question"], "reward": reward,
                         "ok": t["ok"], "error": why, "metrics": t["metrics"]})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the policy's model name on its server")
    p.add_argument("--base-url", required=True, help="the policy's OpenAI-compatible /v1 URL")
    p.add_argument("--retriever-url", default="http://127.0.0.1:8000/retrieve")
    p.add_argument("--topk", type=int, default=3, help="passages a search returns")
    p.add_argument("--reward-url", help="`stepgap serve` URL(s), comma-separated")
    p.add_argument("--reward-config", help="a reward config file (judge+nli, or bundle)")
    p.add_argument("--feedback", choices=("none", "typed"), help="typed: notes in tool responses")
    p.add_argument("--questions", default=str(ROOT / "examples" / "rollout_questions.jsonl"))
    p.add_argument("-n", type=int, default=5, help="questions")
    p.add_argument("-r", type=int, default=1, help="rollouts a question")
    p.add_argument("--output", default="verifiers_runs")
    p.add_argument("--run", default="stepgap-search", help="run name (a folder of --output)")
    a = p.parse_args(argv)
    if not (a.reward_url or a.reward_config):
        p.error("the reward: --reward-url (stepgap serve) or --reward-config FILE")
    if importlib.util.find_spec("stepgap_search") is None:  # a checkout: the package's folder
        sys.path.insert(0, str(ROOT / "environments" / "stepgap_search"))
    from verifiers.v1.cli.eval.main import main as vf_eval

    vf_eval(vf_eval_args(a))
    rows = summary(Path(a.output) / a.run / "traces.jsonl")
    for row in rows:
        shown = f"{row['reward']:.4f}" if row["ok"] else f"no reward ({row['error']})"
        print(f"{shown}\t{row['question']}")
    return rows


if __name__ == "__main__":
    main()
