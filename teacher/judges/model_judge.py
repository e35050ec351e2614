"""What every judge that asks a model shares (`openai:`, `hf:`, the students): the options of
its answer budget, answer cache and price table (`ModelJudgeOptions`, which their own options
classes extend), and the cache and cost meter those options name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from stepgap.options import Options, at_least_one, option

from .base import JUDGE_GROUP, JudgeBackend
from .cache import JudgeCache, default_cache_path
from .cost import PRICES, CostMeter, load_prices

J = TypeVar("J", bound=JudgeBackend)


@dataclass(frozen=True)
class ModelJudgeOptions(Options):
    """What every judge that asks a model takes: its answer budget, the answer cache and the
    price table its cost meter counts with. The judges' own classes add theirs."""

    max_tokens: int | None = option(
        None,
        "judge answer token budget (default: 1024 for a server, 768 for a local model)",
        group=JUDGE_GROUP,
    )
    cache: str | None = option(
        None,
        "judge answer cache (SQLite; default $STEPGAP_CACHE or ~/.cache/stepgap/)",
        metavar="PATH",
        group=JUDGE_GROUP,
    )
    no_cache: bool = option(False, "neither read nor write the cache", group=JUDGE_GROUP)
    prices: str | None = option(
        None,
        "price table JSON {model: {input, cached_input, output}} (USD per 1M tokens), on top of "
        "the built-in GPT-4.1 prices",
        metavar="FILE",
        group=JUDGE_GROUP,
    )

    def __post_init__(self) -> None:
        at_least_one("max_tokens", self.max_tokens)
        super().__post_init__()

    def judge_cache(self) -> JudgeCache | None:
        """The answer cache these options name (None with `no_cache`), not yet opened: a judge
        that fails to build leaves no file behind (`JudgeCache.open` once it is built)."""
        if self.no_cache:
            return None
        return JudgeCache(self.cache or default_cache_path(), open_now=False)

    def cost_meter(self, model: str) -> CostMeter:
        """A meter of `model`'s calls and cost, with the built-in prices and the `prices` file."""
        table = dict(PRICES)
        if self.prices:
            table.update(load_prices(self.prices))
        return CostMeter(model=model, prices=table)


def with_cache_and_meter(
    make: Callable[..., J], model: str, options: ModelJudgeOptions, **kwargs: Any
) -> J:
    """`make(model, options, cache=..., meter=..., **kwargs)`: a model judge with the answer
    cache and the cost meter its options name; the cache file is made once the judge is built."""
    cache = options.judge_cache()
    judge = make(model, options, cache=cache, meter=options.cost_meter(model), **kwargs)
    if cache is not None:
        cache.open()
    return judge
