"""Token lengths of the SFT examples against the recipe's `max_length`.

TRL cuts every tokenized example to `max_length` (or chunks it when packing) without a word.
For the student that cut falls on the completion, the judge JSON it is meant to learn, or on
all of it when the prompt alone fills the window (TRL then drops the example). So the lengths
are measured first, the way TRL tokenizes prompt-completion chat data, counted in the
metrics, and a set where any target would be cut is refused with the length it needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


class TruncationError(ValueError):
    """Some examples are longer than `max_length`: training would cut their targets."""


@dataclass
class LengthReport:
    split: str
    examples: int = 0
    max_length: int = 0
    longest: int = 0  # tokens of the longest example (prompt + target)
    longest_prompt: int = 0
    longest_target: int = 0
    over: list[dict[str, Any]] = field(default_factory=list)  # examples longer than max_length

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["over"] = len(self.over)
        return out

    def problem(self) -> str | None:
        """The refusal message, or None when every example fits."""
        if not self.over:
            return None
        worst = max(self.over, key=lambda o: o["tokens"])
        where = f"trace {worst['trace_id']!r} step {worst['step']}, " if worst["trace_id"] else ""
        return (
            f"{len(self.over)} of {self.examples} {self.split} examples are longer than "
            f"max_length={self.max_length} tokens, so TRL would cut their targets (the judge "
            f"JSON the student learns) or drop them. Longest: {where}{worst['tokens']} tokens "
            f"(prompt {worst['prompt']} + target {worst['tokens'] - worst['prompt']}). Set "
            f"max_length to at least {self.longest} (`--set max_length={self.longest}`), or "
            "rebuild the data with a smaller prompt budget (`stepgap sft-data --evidence-chars "
            "N`, which the trained student keeps when it judges)."
        )


def _ids(tokenizer: Any, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if isinstance(out, Mapping) else out)  # a BatchEncoding


def measure(tokenizer: Any, split: Any, max_length: int, name: str = "train") -> LengthReport:
    """Tokenize every prompt-completion example as TRL does and compare with `max_length`."""
    from tqdm.auto import tqdm

    report = LengthReport(split=name, examples=len(split), max_length=max_length)
    ids = split["trace_id"] if "trace_id" in split.column_names else [None] * len(split)
    steps = split["step"] if "step" in split.column_names else [None] * len(split)
    rows = zip(split["prompt"], split["completion"], ids, steps, strict=True)
    for prompt, completion, trace_id, step in tqdm(
        rows, total=len(split), desc=f"measuring {name} lengths", unit="ex", leave=False
    ):
        n_prompt = len(_ids(tokenizer, prompt, add_generation_prompt=True))
        n = len(_ids(tokenizer, prompt + completion))
        report.longest = max(report.longest, n)
        report.longest_prompt = max(report.longest_prompt, n_prompt)
        report.longest_target = max(report.longest_target, n - n_prompt)
        if n > max_length:
            report.over.append(
                {"trace_id": trace_id, "step": step, "prompt": n_prompt, "tokens": n}
            )
    return report


def check_lengths(tokenizer: Any, data: Any, max_length: int) -> dict[str, Any]:
    """Measure every split of `data` (a DatasetDict); refuse when any example would be cut.
    Returns `{split: report}` for the metrics."""
    reports = [measure(tokenizer, data[name], max_length, name) for name in data]
    problems = [p for r in reports if (p := r.problem())]
    if problems:
        raise TruncationError(" ".join(problems))
    return {r.split: r.as_dict() for r in reports}
