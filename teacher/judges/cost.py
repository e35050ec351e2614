"""Token and cost accounting for judge calls, with a configurable price table."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

# USD per one million tokens: (input, cached input, output). Public list prices, 2025.
PRICES: dict[str, tuple[float, float, float]] = {
    "gpt-4.1-mini": (0.40, 0.10, 1.60),
    "gpt-4.1": (2.00, 0.50, 8.00),
    "gpt-4.1-nano": (0.10, 0.025, 0.40),
    "gpt-4o-mini": (0.15, 0.075, 0.60),
}


def load_prices(path: str | Path) -> dict[str, tuple[float, float, float]]:
    """Read `{"MODEL": {"input": X, "cached_input": Y, "output": Z}, ...}` (USD per 1M tokens)."""
    table = {}
    for model, p in json.loads(Path(path).read_text(encoding="utf-8")).items():
        try:
            table[model] = (
                float(p["input"]),
                float(p.get("cached_input", p["input"])),
                float(p["output"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{path}: price for {model!r} needs numeric 'input' and 'output' ({exc})"
            ) from None
    return table


def listed_price(
    model: str, table: dict[str, tuple[float, float, float]]
) -> tuple[float, float, float] | None:
    """The exact model, else the longest listed prefix (dated snapshots), else None."""
    if model in table:
        return table[model]
    prefixes = [m for m in table if model.startswith(m)]
    return table[max(prefixes, key=len)] if prefixes else None


def price_for(
    model: str, table: dict[str, tuple[float, float, float]]
) -> tuple[float, float, float]:
    """The listed price (`listed_price`), else free (local)."""
    return listed_price(model, table) or (0.0, 0.0, 0.0)


@dataclass
class CostMeter:
    """Running totals over a labeling run; thread-safe, cache hits cost nothing."""

    model: str = ""
    prices: dict[str, tuple[float, float, float]] = field(default_factory=lambda: dict(PRICES))
    calls: int = 0
    cache_hits: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    local: bool = False  # a model run in this process: its calls cost no API money
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, usage: dict[str, int]) -> None:
        with self._lock:
            self.calls += 1
            self.prompt_tokens += int(usage.get("prompt_tokens", 0))
            self.cached_tokens += int(usage.get("cached_tokens", 0))
            self.completion_tokens += int(usage.get("completion_tokens", 0))

    def hit(self) -> None:
        with self._lock:
            self.cache_hits += 1

    def failed(self) -> None:
        with self._lock:
            self.failures += 1

    @property
    def cost(self) -> float:
        p_in, p_cached, p_out = price_for(self.model, self.prices)
        fresh = self.prompt_tokens - self.cached_tokens
        return (fresh * p_in + self.cached_tokens * p_cached + self.completion_tokens * p_out) / 1e6

    def postfix(self) -> dict[str, str]:
        return {
            "cost": f"${self.cost:.4f}",
            "tok": f"{self.prompt_tokens}/{self.completion_tokens}",
            "hits": str(self.cache_hits),
        }

    def summary(self) -> str:
        """One line for the end of a run: calls, cache hits, failures, tokens and cost (no cost
        for a local model; an API model without a listed price says so, not $0)."""
        calls = f"{self.calls} answer(s)" if self.local else f"{self.calls} API call(s)"
        line = (
            f"judge {self.model}: {calls}, {self.cache_hits} cache hit(s), "
            f"{self.failures} failed step(s); tokens in {self.prompt_tokens} "
            f"(cached {self.cached_tokens}), out {self.completion_tokens}"
        )
        if self.local:
            return line
        if not self.priced:
            return f"{line}; cost unknown: no price for {self.model} (add one with --prices FILE)"
        return f"{line}; cost ${self.cost:.4f}"

    @property
    def priced(self) -> bool:
        """Whether the price table lists this model (or a prefix of its name)."""
        return listed_price(self.model, self.prices) is not None

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "model": self.model,
            "calls": self.calls,
            "cache_hits": self.cache_hits,
            "failures": self.failures,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": round(self.cost, 6),
        }
