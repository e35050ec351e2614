"""A checker from spec strings: what `--judge`, `--nli` and `--bundle` mean, for the CLI and for
Python users alike (a notebook, a veRL worker, a sweep script)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepgap.registry import resolve

from .checker import Checker
from .judges import JudgeBackend
from .nli import NLIBackend
from .tree import TreeConfig

if TYPE_CHECKING:
    from .nli.onnx import Provider

# A bundle's checker (the export and serving layers, above this one), by import path.
BUNDLE_CHECKER = "stepgap.serving.offline:OfflineChecker.from_bundle"


def build_judge(
    spec: str,
    *,
    cache: str | Path | bool | None = None,
    prices: str | Path | dict[str, tuple[float, float, float]] | None = None,
    **options: Any,
) -> JudgeBackend:
    """A judge backend from `openai:MODEL`, `hf:PATH_OR_ID`, `student:PATH` or `replay:FILE`.

    Model judges share the on-disk answer cache (`cache`: a path, None for the default
    `$STEPGAP_CACHE` or `~/.cache/stepgap/`, False for none) and count tokens and cost with
    `prices` (a price-table JSON file or a dict, on top of the built-in GPT-4.1 prices). Other
    options go to the backend (`base_url`, `concurrency`, `device`, `batch_size`, ...); options a
    backend does not take are ignored.
    """
    from .judges import PRICES, CostMeter, JudgeCache, default_cache_path, load_judge

    table = dict(PRICES)
    if isinstance(prices, dict):
        table.update(prices)
    elif prices:
        from .judges.cost import load_prices

        table.update(load_prices(prices))
    kind, _, model = spec.partition(":")
    use_cache = kind != "replay" and cache is not False  # replay answers are already on disk
    store = JudgeCache(cache or default_cache_path()) if use_cache else None  # type: ignore[arg-type]
    max_tokens = options.pop("max_tokens", None)
    return load_judge(
        spec,
        **options,
        max_tokens=max_tokens,
        max_new_tokens=max_tokens,
        cache=store,
        meter=CostMeter(model=model, prices=table),
    )


def build_checker(
    judge: str | JudgeBackend | None = None,
    nli: str | NLIBackend | None = None,
    *,
    bundle: str | Path | None = None,
    tree: TreeConfig | None = None,
    device: str | None = None,
    nli_precision: str | None = None,
    nli_providers: Sequence[Provider] | None = None,
    judge_options: dict[str, Any] | None = None,
) -> Checker:
    """The hybrid checker from a judge and an NLI model (specs or backends), or the offline
    checker of an exported bundle (`bundle=`, which brings its own judge, NLI and thresholds).
    With a bundle, `judge="openai:NAME"` asks the bundle's student served by an
    OpenAI-compatible engine (`judge_options["base_url"]`) instead of loading it here; the
    bundle still gives the schema, prompt version, NLI model and thresholds.

    `device` places the NLI model; `judge_options` go to `build_judge` (for a bundle: the
    student's `device`, `dtype`, `batch_size` and `max_tokens`). `nli_providers`: the bundle's
    ONNX Runtime execution providers (`OfflineChecker.from_bundle`).
    """
    options = dict(judge_options or {})
    if bundle:
        if nli:
            raise ValueError("--bundle brings its own NLI model; drop --nli")
        served = None
        if judge is not None:
            kind, _, name = judge.partition(":") if isinstance(judge, str) else ("", "", "")
            if kind != "openai" or not name:
                raise ValueError(
                    "with --bundle, --judge can only be openai:NAME: the bundle's student served "
                    "by an OpenAI-compatible engine (vLLM, SGLang, llama.cpp) at --base-url"
                )

            def served(meta: dict[str, Any]) -> JudgeBackend:
                return build_judge(
                    f"openai-student:{name}",
                    nli_features=bool(meta.get("nli_features", False)),
                    earlier_evidence_chars=meta.get("earlier_evidence_chars"),
                    target=meta.get("target") or "full",  # the schema it was trained to write
                    **options,
                )

        return resolve(BUNDLE_CHECKER)(
            bundle,
            nli_precision=nli_precision,
            nli_providers=nli_providers,
            device=options.get("device"),
            dtype=options.get("dtype"),
            batch_size=options.get("batch_size") or 8,
            max_new_tokens=options.get("max_tokens") or 768,
            served_judge=served,
        )
    if not judge or not nli:
        raise ValueError("give --judge and --nli, or --bundle")
    if nli_providers:
        raise ValueError("--nli-provider picks the ONNX Runtime providers of a --bundle")
    from .nli import load_nli

    judge_backend = build_judge(judge, **options) if isinstance(judge, str) else judge
    nli_backend = load_nli(nli, device=device) if isinstance(nli, str) else nli
    return Checker(judge_backend, nli_backend, tree)
