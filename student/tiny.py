"""`tiny-random:qwen2`: a tiny random Qwen2 student for CPU tests and the `tiny` recipe.

The real Qwen2.5 vocabulary (151k tokens) makes the LM head the whole cost of a CPU step, so the
tiny student gets a byte-level BPE vocabulary of a few thousand tokens trained on its own SFT
data, with Qwen2's special tokens and chat template. Merges may cross spaces (up to 16
characters), so the repeated instructions and JSON keys become few tokens and a judge prompt is
~400 tokens instead of ~1,100: what keeps a CPU training step near a second. The architecture is
the real Qwen2ForCausalLM, initialised wider than usual so that its frozen random LM head can
still express confident next-token choices once LoRA steers the hidden states.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

TINY_REF = "tiny-random:qwen2"
TINY_BASE = "tiny-base"  # the folder under output_dir it is built in

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]  # ids 151643.. in Qwen2.5

QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}{% generation %}"
    "{{- message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def qwen_style_tokenizer(backend: Any) -> Any:
    """Wrap a `tokenizers.Tokenizer` as a Qwen2-style fast tokenizer with the chat template."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=32768,
        model_input_names=["input_ids", "attention_mask"],  # as Qwen2's tokenizer: no token types
    )
    tok.chat_template = QWEN_CHAT_TEMPLATE
    return tok


def corpus_tokenizer(
    texts: Iterable[str], vocab_size: int = 4096, max_token_chars: int = 16
) -> Any:
    """A byte-level BPE (every string encodable) trained on `texts`, Qwen2 special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=QWEN_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        max_token_length=max_token_chars,
    )
    backend.train_from_iterator(texts, trainer)
    return qwen_style_tokenizer(backend)


def build_tiny_qwen2(
    path: str | Path,
    tokenizer: Any,
    *,
    hidden: int = 128,
    layers: int = 2,
    seed: int = 0,
    initializer_range: float = 0.2,
) -> Path:
    """Save a random Qwen2ForCausalLM sized for `tokenizer`, and the tokenizer, under `path`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    from stepgap.models import STAND_IN_KEY

    setattr(
        config, STAND_IN_KEY, "a tiny random-weight Qwen2 (tiny-random:qwen2), for tests and demos"
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return Path(path)


def sft_texts(dataset: Any) -> Iterable[str]:
    """Every message text of a prompt-completion chat data set."""
    for example in dataset:
        for message in [*example["prompt"], *example["completion"]]:
            yield message["content"]


def tiny_student_base(path: str | Path, dataset: Any, seed: int = 0) -> Path:
    """Build (once) the tiny random student for `dataset` under `path`; reuse it afterwards."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    return build_tiny_qwen2(path, corpus_tokenizer(sft_texts(dataset)), seed=seed)
