"""The decoding loop's KV cache, which writes each step in place (`kv_cache.GrowingLayer`)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM
from transformers.cache_utils import DynamicLayer

from stepgap.teacher.judges.kv_cache import GrowingLayer, growing_cache


def _states(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(rows, 2, length, 8, generator=generator) for _ in range(2))


def test_a_growing_layer_holds_what_a_dynamic_one_does_and_writes_steps_in_place():
    """Prompt, then steps of 1 and 3 tokens, past its room, with rows dropped on the way (in
    the decoding loop's order, a kept row moved into a dropped one's place): the keys and
    values (and the lengths transformers reads) are a DynamicLayer's at each update, and a
    step within the room, or a drop, writes into the same buffer."""
    from stepgap.teacher.judges.decoding import kept_in_place

    growing, dynamic = GrowingLayer(room=4), DynamicLayer()
    buffers = []
    for seed, (rows, length) in enumerate([(4, 10), (4, 1), (4, 3), (4, 1), (4, 1), (4, 3)]):
        if seed == 4:
            keep = torch.tensor(kept_in_place([0, 2, 3]))
            assert keep.tolist() == [0, 3, 2]
            growing.batch_select_indices(keep)
            dynamic.batch_select_indices(keep)
        keys, values = _states(rows if seed < 4 else 3, length, seed)
        got = growing.update(keys, values)
        want = dynamic.update(keys, values)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert growing.get_seq_length() == dynamic.get_seq_length()
        assert growing.get_mask_sizes(1) == dynamic.get_mask_sizes(1)
        buffers.append(growing.buffers[0].data_ptr())
    # 10 + room 4 holds the steps of 1 and 3 tokens; the next 1 grows it, once; a row drop
    # moves a row within it; 3 more fit the grown room
    assert buffers[0] == buffers[1] == buffers[2]
    assert buffers[3] != buffers[2] and buffers[3] == buffers[4] == buffers[5]
    assert growing.buffers[0].shape[-2] == 10 + 1 + 3 + 1 + 4


@pytest.fixture(scope="module")
def small_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


def test_a_padded_batch_decodes_the_same_logits_over_the_growing_cache(small_qwen2):
    """A left-padded batch's prefill and decode steps (one token, then a chunk of two) give
    bit-identical logits over the growing cache and over transformers' DynamicCache."""
    ids = torch.randint(3, 300, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    logits = []
    for cache in (DynamicCache(), growing_cache(small_qwen2, room=2)):
        with torch.inference_mode():
            step_mask, positions = mask, (mask.cumsum(-1) - 1).clamp(min=0)
            out = [small_qwen2(input_ids=ids, attention_mask=mask, position_ids=positions,
                               past_key_values=cache, use_cache=True).logits]  # fmt: skip
            last = positions[:, -1:]
            for width in (1, 2, 1):  # past the room of 2: the buffer grows
                step = out[-1][:, -1:].argmax(-1).repeat(1, width)
                step_mask = torch.cat([step_mask, torch.ones_like(step)], dim=1)
                out.append(small_qwen2(
                    input_ids=step, attention_mask=step_mask,
                    position_ids=last + 1 + torch.arange(width), past_key_values=cache,
                    use_cache=True,
                ).logits)  # fmt: skip
                last = last + width
        logits.append(out)
    for dynamic, growing in zip(*logits, strict=True):
        assert torch.equal(dynamic, growing)


def test_a_model_with_sliding_window_layers_keeps_transformers_cache(small_qwen2):
    config = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=8)
    config.layer_types = ["sliding_attention", "full_attention"]
    model = type("Model", (), {"config": config})()
    assert isinstance(growing_cache(model, room=4), DynamicCache)
    cache = growing_cache(small_qwen2, room=4)
    assert [type(layer) for layer in cache.layers] == [GrowingLayer, GrowingLayer]


@pytest.mark.parametrize("rows", [1, 2])
def test_a_batch_prefilled_a_part_at_a_time_decodes_as_one_prefilled_at_once(
    small_qwen2, monkeypatch, rows
):
    """The decoder's prefill a part of the batch at a time (on a CPU: `prefill_rows`), each
    part left-padded to its own width and placed at the right of the batch's rows, gives the
    prefill's logits, and then a decode step's, of the whole batch in one forward (to float
    rounding: other matrix shapes); the batch's left padding holds zeros."""
    from types import SimpleNamespace

    from stepgap.teacher.judges import decoding

    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 300, (n,), generator=generator).tolist() for n in (12, 7, 9)]
    decoder = decoding.GreedyDecoder(
        small_qwen2, SimpleNamespace(pad_token_id=0, eos_token_id=1), max_new_tokens=4
    )
    results = []
    for part in (3, rows):
        monkeypatch.setattr(decoding, "prefill_rows", lambda model, width, part=part: part)
        cache = growing_cache(small_qwen2, room=4)
        with torch.inference_mode():
            logits, attention = decoder._prefill(prompts, cache)
            step = logits.argmax(-1, keepdim=True)
            attention = torch.cat([attention, torch.ones_like(step)], dim=1)
            after = small_qwen2(
                input_ids=step, attention_mask=attention, past_key_values=cache,
                position_ids=attention.sum(-1, keepdim=True) - 1, use_cache=True,
            ).logits[:, -1]  # fmt: skip
        results.append((logits, after, cache))
    (whole, whole_after, _), (parted, parted_after, cache) = results
    assert torch.allclose(whole, parted, atol=1e-5) and torch.equal(
        whole.argmax(-1), parted.argmax(-1)
    )
    assert torch.allclose(whole_after, parted_after, atol=1e-5)
    layer = cache.layers[0]
    assert layer.get_seq_length() == 12 + 1 and layer.buffers[0].shape[-2] == 12 + 4
    if rows == 1:  # each row its own width: the 7-token prompt's 5 padded positions are zeros
        assert not layer.keys[1, :, :5].any() and layer.keys[1, :, 5:12].abs().sum() > 0


def test_a_model_with_sliding_window_layers_prefills_its_batch_in_one_forward(monkeypatch):
    """Its cache is transformers' own (no layers until the first update), so the prefill in
    parts, which places each part into growing layers, does not apply: one forward of the
    whole batch, as before."""
    from types import SimpleNamespace

    from stepgap.teacher.judges import decoding

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
        use_sliding_window=True, sliding_window=8, max_window_layers=1,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    cache = growing_cache(model, room=4)
    assert isinstance(cache, DynamicCache) and not cache.layers
    monkeypatch.setattr(decoding, "prefill_rows", lambda model, width: 1)
    decoder = decoding.GreedyDecoder(
        model, SimpleNamespace(pad_token_id=0, eos_token_id=1), max_new_tokens=4
    )
    with torch.inference_mode():
        logits, attention = decoder._prefill([[5, 6, 7, 8], [9, 10]], cache)
    assert logits.shape == (2, 300) and attention.shape == (2, 4)
    assert cache.get_seq_length() == 4 and cache.layers[0].keys.shape[0] == 2


def test_a_row_drop_finds_the_rows_to_move_once_for_every_layer(small_qwen2, monkeypatch):
    """Finding the moved rows waits for the device (`nonzero`): the judge's cache does it once
    a drop, where transformers' cache asks each layer (28 of them for Qwen2.5-7B), and every
    layer keeps the same rows as a layer asked alone would."""
    from stepgap.teacher.judges import kv_cache

    cache, alone = growing_cache(small_qwen2, room=4), GrowingLayer(room=4)
    for seed, layer in enumerate([*cache.layers, alone]):
        layer.update(*_states(4, 6, seed % 2))
    found = []
    real = kv_cache.RowMoves.of
    monkeypatch.setattr(kv_cache.RowMoves, "of", lambda i: found.append(i) or real(i))
    cache.batch_select_indices(torch.tensor([0, 3, 2]))
    assert len(found) == 1 and len(cache.layers) == 2
    alone.batch_select_indices(torch.tensor([0, 3, 2]))
    assert torch.equal(cache.layers[0].keys, alone.keys)
    assert torch.equal(cache.layers[0].values, alone.values)
