"""bench/prm_student.py runs as shipped at CI sizes: every contender labels the same workload,
the PRMs every step of it, and the FLOPs it reports are the configs' weights at work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.bench import bench_script

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_bench_times_every_contender_on_the_same_steps(tmp_path):
    out = tmp_path / "prm_student.json"
    done = subprocess.run(
        [sys.executable, "bench/prm_student.py", "--tiny", "--steps", "10", "--student-hf-steps",
         "3", "--repeats", "1", "--max-new-tokens", "24", "--max-string-chars", "4", "--no-vllm",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert list(runs) == ["prm_tiny_torch", "prm_tiny_onnx_int8", "student_hf"]
    for name in ("prm_tiny_torch", "prm_tiny_onnx_int8"):  # one verdict a step, each labelled
        assert runs[name]["steps"] == runs[name]["labelled"] == 10, name
        assert runs[name]["tokens_read_mean"] > 0
    assert runs["student_hf"]["steps"] == 3 and runs["student_hf"]["tokens_read_mean"] > 100
    assert report["student_vllm"] == "skipped (--no-vllm)"
    flops = {k: v["flops_per_step"] for k, v in report["flops"].items()}
    assert flops["qwen2.5_7b"] > flops["student"] > flops["prm_tiny"] > 0
    ratios = report["ratios"]
    assert ratios["steps_per_s_reference"] == "student_hf"
    assert ratios["qwen2.5_7b_flops_vs_prm_tiny"] == pytest.approx(
        flops["qwen2.5_7b"] / flops["prm_tiny"], rel=1e-3
    )
    assert "prm_tiny_onnx_int8_vs_student_hf" in done.stdout


def _weights(model) -> int:
    """Weights a token passes through: all but the input embedding's lookup."""
    embedding = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p is not embedding)


def test_a_decoders_flops_are_twice_its_weights_a_token():
    """One prompt token, no answer: its FLOPs are twice the weights it meets (the LM head's
    included, once, for the next token), on Qwen2.5-7B's real shape, built on the meta device."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    bench = bench_script("prm_student")
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**bench.QWEN25_7B, tie_word_embeddings=False))
    assert bench.decoder_flops(bench.QWEN25_7B, 1, 0) == pytest.approx(
        2 * _weights(model), rel=0.01
    )


def test_an_encoders_dense_flops_are_twice_its_weights_a_token():
    """DeBERTa-v3-base's shape with the PRM's heads: the FLOPs of n tokens less the attention
    and relative-position terms are twice the weights (embeddings aside) times n."""
    import torch
    from transformers import DebertaV2Config, DebertaV2ForTokenClassification

    bench = bench_script("prm_student")
    from stepgap.student.prm import COLUMNS

    arch = bench.PRM_ARCHS["base"]
    with torch.device("meta"):
        model = DebertaV2ForTokenClassification(
            DebertaV2Config(**arch, vocab_size=bench.DEBERTA_V3_VOCAB, num_labels=COLUMNS)
        )
    n, d, layers = 300, arch["hidden_size"], arch["num_hidden_layers"]
    span = 2 * arch["position_buckets"]
    # what is not a token meeting a weight: scores and values, the relative terms
    others = layers * (4 * n * n * d + 4 * span * d * d + 4 * n * span * d)
    encoder = model.deberta.encoder
    relative = encoder.rel_embeddings.weight.numel() + encoder.LayerNorm.weight.numel() * 2
    dense = _weights(model) - relative  # the relative table is not a weight a token meets
    assert bench.encoder_flops(arch, n, COLUMNS) - others == pytest.approx(2 * n * dense, rel=0.01)
