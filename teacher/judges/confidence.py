"""Stage confidences from token probabilities of the judge's decisive fields (docs/contract.md, section 3).

A stage's confidence is the probability the judge gave to the values that decide it: the first
token of each boolean, multiplied within the stage. Works for any backend that can list its
output as (token text, log-probability) pairs: OpenAI `logprobs` or local generation scores.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

STAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "A": ("is_off_target",),
    "B": ("is_abstention_step", "abstention_is_accurate"),
    "C": ("entity_match", "found_quote"),
}


def stage_confidences(tokens: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Map stage letter -> probability, for the stages whose fields were all found."""
    if not tokens:
        return {}
    starts, pos = [], 0
    for text, _ in tokens:
        starts.append(pos)
        pos += len(text)
    text = "".join(t for t, _ in tokens)

    def prob_at(char: int) -> float:
        lo, hi = 0, len(starts) - 1
        while lo < hi:  # last token starting at or before `char`
            mid = (lo + hi + 1) // 2
            if starts[mid] <= char:
                lo = mid
            else:
                hi = mid - 1
        return math.exp(tokens[lo][1])

    out = {}
    for stage, fields in STAGE_FIELDS.items():
        probs = []
        for name in fields:
            m = re.search(rf'"{name}"\s*:\s*', text)
            if m is None:
                break
            probs.append(prob_at(m.end()))
        else:
            out[stage] = math.prod(probs)
    return out
