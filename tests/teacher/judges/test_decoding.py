"""The judge's attention for padded batches of grouped-query models (`_grouped_sdpa`)."""

from __future__ import annotations

import types

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa

from stepgap.teacher.judges import decoding


def _attention_inputs(length: int, context: int = 40, device: str = "cpu") -> tuple:
    """Query, key, value of a grouped-query layer (6 query heads over 2 key-value heads, 3
    rows, `length` new tokens over `context` cached ones) as transformers hands them to an
    attention function, and a left-padded causal mask as its `sdpa_mask` makes one."""
    generator = torch.Generator().manual_seed(length)
    rows, heads, kv_heads, dim = 3, 6, 2, 16
    total = context + length

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device)

    query = randn(rows, length, heads, dim).transpose(1, 2)  # (rows, heads, length, dim), strided
    key, value = randn(rows, kv_heads, total, dim), randn(rows, kv_heads, total, dim)
    causal = torch.ones(length, total, dtype=torch.bool).tril(context)
    mask = causal.expand(rows, 1, length, total).clone()
    mask[0, :, :, :7] = False  # row 0 left-padded
    mask[2, :, :, :3] = False
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    return module, query, key, value, mask.to(device)


@pytest.mark.parametrize("length", [1, 5, decoding.FOLDED_QUERIES, 80])
def test_grouped_attention_equals_transformers_sdpa_without_copying_heads(length, monkeypatch):
    """A decode step (one token, or a chosen token and its schema-forced ones) folds each
    key-value head's query heads into one query of that head; a prompt (more than
    `FOLDED_QUERIES` tokens) on a CPU attends with SDPA's grouped heads. Either way the output
    is transformers' own SDPA's, and no key or value head is copied."""
    module, query, key, value, mask = _attention_inputs(length)
    expected, _ = sdpa.sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    calls: list[tuple[int, bool]] = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        calls.append((q.shape[1], kwargs.get("enable_gqa", False)))
        return real_sdpa(q, k, v, **kwargs)

    copies: list[int] = []
    real_repeat = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda h, n: copies.append(n) or real_repeat(h, n))
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    out, _ = decoding._grouped_sdpa(module, query, key, value, mask, scaling=0.25)
    assert out.shape == expected.shape == (3, length, 6, 16)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert copies == []
    folded = length <= decoding.FOLDED_QUERIES
    assert calls == [(2, False)] if folded else calls == [(6, True)]


def test_grouped_attention_leaves_a_prompt_on_a_gpu_and_unmasked_batches_to_transformers(
    monkeypatch,
):
    """Off a CPU a prompt goes to transformers' SDPA (CUDA's kernels take no mask with grouped
    heads: SDPA would fall back to its slowest one), as do a batch without a mask and a decode
    step with a mask per head; a decode step off a CPU is folded."""
    handed: list[int] = []
    monkeypatch.setattr(
        sdpa, "sdpa_attention_forward",
        lambda module, query, *args, **kwargs: handed.append(query.shape[2]) or (query, None),
    )  # fmt: skip
    module, query, key, value, mask = _attention_inputs(80, device="meta")
    decoding._grouped_sdpa(module, query, key, value, mask)
    module, query, key, value, _ = _attention_inputs(1)
    decoding._grouped_sdpa(module, query, key, value, None)
    assert handed == [80, 1]
    module, query, key, value, mask = _attention_inputs(1, device="meta")
    out, _ = decoding._grouped_sdpa(module, query, key, value, mask)
    assert handed == [80, 1] and out.shape == (3, 1, 6, 16) and out.device.type == "meta"
    per_head = mask.expand(3, 6, 1, mask.shape[-1])  # a mask for each query head: not folded
    decoding._grouped_sdpa(module, query, key, value, per_head)
    assert handed == [80, 1, 1]


@pytest.mark.parametrize(
    ("device", "folds"), [("cpu", True), ("cuda", True), ("mps", False), ("meta", False)]
)
def test_the_judge_folds_grouped_heads_on_a_cpu_and_a_cuda_gpu(device, folds):
    """The judge's model attends with folded heads on a CPU and on a CUDA GPU (on an H200 a
    decode forward of 256 rows took 44 ms folded, 212 ms with the heads copied); another
    device keeps transformers' attention, as does a model transformers refuses SDPA to."""
    set_to: list[str] = []
    model = types.SimpleNamespace(
        device=torch.device(device), set_attn_implementation=set_to.append
    )
    assert decoding.attend_grouped(model) is folds
    assert set_to == ([decoding.GROUPED_SDPA] if folds else [])

    def refuse(name: str) -> None:
        raise ValueError(f"{name}: this model does not support SDPA")

    model.set_attn_implementation = refuse
    assert decoding.attend_grouped(model) is False


def test_a_real_model_attends_with_folded_heads_and_keeps_its_logits(tiny_qwen2, monkeypatch):
    """transformers takes the registered implementation by its public call, and a padded
    batch's logits are transformers' own SDPA's."""
    from transformers import AutoModelForCausalLM

    calls = []
    real = decoding._grouped_sdpa
    monkeypatch.setattr(decoding, "_grouped_sdpa", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, attn_implementation="sdpa").eval()
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.inference_mode():
        before = model(input_ids=ids, attention_mask=mask).logits
        assert decoding.attend_grouped(model) is True
        after = model(input_ids=ids, attention_mask=mask).logits
    assert len(calls) == model.config.num_hidden_layers  # each layer, the second forward
    torch.testing.assert_close(after[:, 2:], before[:, 2:], atol=1e-5, rtol=1e-4)
