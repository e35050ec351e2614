"""NLI pairs/s on CPU for the DeBERTa-v3-base architecture: PyTorch fp32 vs ONNX fp32 vs int8s.

    python bench/nli_onnx.py [--pairs 128] [--batch-size 64] [--rounds 3] [--out bench/results]

Random weights of the real architecture (speed does not depend on weight values), the test
fixture's SentencePiece tokenizer, premise/hypothesis pairs from the example traces truncated
to 128 tokens as in stages D-E. Every variant runs through stepgap's own backends (`HFNLI`,
`ONNXNLI`): the same batching and premise-only truncation. The int8 variants take the levers
of the NLI speed-up one at a time and together: token-length buckets (vs the old character-length
sort), per-channel weights, ORT's fusions before quantization. Rounds are interleaved (each
round times every variant once) and the median is reported, as other work may share the CPU.
Prints pairs/s, the ratio to PyTorch fp32 and each variant's label agreement with ONNX fp32;
writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_base_nli(path: Path) -> Path:
    """DeBERTa-v3-base's shape (12 x 768, relative attention), 3 NLI labels, random weights."""
    from tests.fixtures.models import build_deberta_nli

    return build_deberta_nli(
        path,
        vocab_size=128100,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        position_buckets=256,
    )


def example_pairs(n: int) -> list[tuple[str, str]]:
    """(snippet, claim) pairs of the example traces, cycled with an index to make them distinct."""
    from stepgap.segment import iter_traces

    base = [
        (snip.text, step.claim or step.answer or "")
        for t in iter_traces(REPO / "examples" / "traces.jsonl")
        for step in t.steps or []
        for snip in step.evidence
    ]
    return [(f"{p} ({i})", h) for i, (p, h) in enumerate(base[i % len(base)] for i in range(n))]


def char_sorted(backend):
    """`backend` batching pairs by character length, as before token-length buckets."""
    backend._token_lengths = lambda pairs: [len(p) + len(h) for p, h in pairs]
    return backend


def interleaved(
    backends: dict, pairs: list[tuple[str, str]], rounds: int
) -> dict[str, list[float]]:
    """Pairs/s of every backend in each of `rounds` rounds, after one warm-up batch each.

    Each round times every backend once, so load from other work spreads over all of them."""
    for b in backends.values():
        b.predict(pairs[: b.batch_size])
    runs: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(rounds):
        for name, b in backends.items():
            start = time.perf_counter()
            b.predict(pairs)
            runs[name].append(len(pairs) / (time.perf_counter() - start))
    return runs


def main() -> None:
    import torch

    from stepgap.export.onnx_nli import INT8_PLAIN, Int8Recipe, export_onnx, quantize_int8
    from stepgap.teacher.nli.hf import HFNLI
    from stepgap.teacher.nli.onnx import ONNX_FILES, ONNXNLI
    from stepgap.tree import nli_label

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args()
    pairs = example_pairs(args.pairs)
    common = {"batch_size": args.batch_size, "max_length": args.max_length}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_base_nli(Path(tmp) / "deberta-v3-base-arch")
        onnx_dir = export_onnx(str(model), Path(tmp) / "onnx", int8=True)  # the shipped int8
        # the other int8 graphs, each a folder beside the export sharing its tokenizer/config
        recipes = {
            "plain": INT8_PLAIN,
            "per_channel": Int8Recipe(fuse=False),
            "fused": Int8Recipe(per_channel=False, reduce_range=False),
        }
        dirs = {}
        for name, recipe in recipes.items():
            d = dirs[name] = Path(tmp) / f"onnx-{name}"
            d.mkdir()
            for f in onnx_dir.iterdir():
                if f.name not in ONNX_FILES.values():
                    (d / f.name).symlink_to(f)
            quantize_int8(onnx_dir / ONNX_FILES["fp32"], d / ONNX_FILES["int8"], recipe)
        prepared_s = time.perf_counter() - started

        def onnx(path: Path, precision: str) -> ONNXNLI:
            return ONNXNLI(path, precision=precision, providers=["CPUExecutionProvider"], **common)

        backends = {
            "pytorch_fp32": HFNLI(str(model), device="cpu", dtype="float32", **common),
            "onnx_fp32": onnx(onnx_dir, "fp32"),
            "int8_old (char sort)": char_sorted(onnx(dirs["plain"], "int8")),
            "int8_old + buckets": onnx(dirs["plain"], "int8"),
            "int8 per-channel": onnx(dirs["per_channel"], "int8"),
            "int8 fused": onnx(dirs["fused"], "int8"),
            "int8 shipped (all)": onnx(onnx_dir, "int8"),
        }
        runs = interleaved(backends, pairs, args.rounds)
        probs = {name: b.predict(pairs) for name, b in backends.items() if name != "pytorch_fp32"}

    def top(x) -> str:
        return max(("entailment", "neutral", "contradiction"), key=lambda k: getattr(x, k))

    def agreement(name: str) -> dict[str, float]:
        both = list(zip(probs["onnx_fp32"], probs[name], strict=True))
        return {
            "tree_labels": sum(nli_label(a) == nli_label(b) for a, b in both) / len(both),
            "argmax": sum(top(a) == top(b) for a, b in both) / len(both),
        }

    speed = {name: statistics.median(v) for name, v in runs.items()}
    base = speed["pytorch_fp32"]
    result = {
        "bench": "nli_onnx",
        "device": f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} logical",
        "threads": {"torch": torch.get_num_threads(), "onnxruntime": "default (physical cores)"},
        "load_average_at_end": os.getloadavg(),
        "pairs": len(pairs),
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "rounds": args.rounds,
        "pairs_per_s_median": speed,
        "pairs_per_s_runs": runs,
        "ratio_to_pytorch_fp32": {k: v / base for k, v in speed.items()},
        "label_agreement_with_onnx_fp32": {k: agreement(k) for k in probs if k != "onnx_fp32"},
        "prepare_s": prepared_s,
        "total_s": time.perf_counter() - started,
    }
    print(f"{'variant':22} {'pairs/s':>8} {'x pytorch':>10} {'agree (tree/argmax)':>20}")
    for name, v in speed.items():
        a = result["label_agreement_with_onnx_fp32"].get(name)
        shown = f"{a['tree_labels']:.1%} / {a['argmax']:.1%}" if a else "-"
        print(f"{name:22} {v:8.1f} {v / base:10.2f} {shown:>20}")
    print(f"median of {args.rounds} interleaved rounds; load average {os.getloadavg()}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nli_onnx.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(REPO))  # tests.fixtures (the stand-in tokenizer)
    main()
