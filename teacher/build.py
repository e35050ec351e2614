"""A checker from spec strings: what `--judge` and `--nli` mean, for the CLI and for Python users
alike (a notebook, a veRL worker, a sweep script). `CheckerConfig` is the checker's
configuration as data, a bundle's fields included; a bundle is loaded a layer up, beside the
bundle it reads (`stepgap.export.offline`), where the command line and the reward choose
between the two."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from stepgap.registry import BackendOptionError, Default
from stepgap.tree import TreeConfig

from .checker import Checker
from .judges import JudgeBackend
from .nli import NLIBackend

if TYPE_CHECKING:
    from .nli.onnx import Provider

# `build_judge`'s options that local models' backends (and a bundle's student) take by their
# transformers names: renamed for a backend that does not take ours
LOCAL_NAMES = {"max_tokens": "max_new_tokens"}


def build_judge(
    spec: str,
    *,
    cache: str | Path | bool | None = None,
    prices: str | Path | dict[str, tuple[float, float, float]] | None = None,
    **options: Any,
) -> JudgeBackend:
    """A judge backend from `openai:MODEL`, `hf:PATH_OR_ID`, `student:PATH`, `replay:FILE` or
    an installed plug-in's `KIND:ARG`.

    Model judges share the on-disk answer cache (`cache`: a path, None for the default
    `$STEPGAP_CACHE` or `~/.cache/stepgap/`, False for none) and count tokens and cost with
    `prices` (a price-table JSON file or a dict, on top of the built-in GPT-4.1 prices), where the
    backend takes a cache and a meter. Other options go to the backend (`base_url`,
    `concurrency`, `device`, `batch_size`, ...): one it does not take is an error naming it,
    unless its value is a `Default` (a setting left at its default). `max_tokens` is the answer
    budget, `max_new_tokens` to local models.
    """
    from .judges import JUDGES

    kind, model = JUDGES.parse(spec)
    what = f"the judge backend {kind!r}"
    return build_judge_with(
        JUDGES.factory(kind), model, what, cache=cache, prices=prices, **options
    )


def build_judge_with(
    factory: Callable[..., JudgeBackend],
    model: str,
    what: str,
    *,
    cache: str | Path | bool | None = None,
    prices: str | Path | dict[str, tuple[float, float, float]] | None = None,
    **options: Any,
) -> JudgeBackend:
    """`build_judge` for a judge class (`factory`, `what` in errors) named by its caller rather
    than by a spec (a bundle's served student): the answer cache and cost meter where `factory`
    takes them, `max_tokens` renamed for local models, the other options checked
    (`stepgap.registry.call_checked`)."""
    from stepgap.registry import call_checked, of_interface, taken_options

    from .judges import PRICES, CostMeter, JudgeCache, default_cache_path

    taken = taken_options(factory)

    def takes(option: str) -> bool:
        return taken is None or option in taken

    table = dict(PRICES)
    if isinstance(prices, dict):
        table.update(prices)
    elif prices:
        from .judges.cost import load_prices

        table.update(load_prices(prices))
    opened = None  # the cache file is made once the backend is built (not for a missing key)
    if cache is not False and takes("cache"):
        opened = JudgeCache(cache or default_cache_path(), open_now=False)  # type: ignore[arg-type]
        options["cache"] = opened
    elif cache:
        options["cache"] = cache  # a cache the backend cannot use: the option error says so
    if takes("meter"):
        options["meter"] = CostMeter(model=model, prices=table)
    for ours, local in LOCAL_NAMES.items():
        if ours in options and not takes(ours):
            options[local] = options.pop(ours)
    backend = of_interface(call_checked(factory, model, what, **options), JudgeBackend, what)
    if opened is not None:
        opened.open()
    return backend


def require_specs(judge: object, nli: object, bundle: object) -> None:
    """What names a checker: a judge and an NLI model, or a bundle."""
    if not bundle and not (judge and nli):
        raise ValueError("give --judge and --nli, or --bundle")


def _option(default: Any, help: str, group: str, **extra: Any) -> Any:
    """A field that is also a command-line flag: its help, its flag group, a metavar."""
    return Field(default, description=help, json_schema_extra={"group": group, **extra})


# Keys a configuration file may not hold, with the way to do it instead.
REFUSED_KEYS = {
    "api_key": "an API key is never read from a file: name the environment variable that holds "
    "it with api_key_env (default OPENAI_API_KEY)",
}
JUDGE, NLI, BUNDLE = "judge (stages A-C)", "NLI (stages D-E) and the tree", "offline bundle"


# `build_judge`'s options and the `CheckerConfig` fields (flags) that set them
JUDGE_FIELDS = {
    "base_url": "base_url",
    "api_key_env": "api_key_env",
    "response_format": "response_format",
    "concurrency": "concurrency",
    "engine_slots": "engine_slots",
    "max_retries": "max_retries",
    "timeout": "timeout",
    "invalid_retries": "invalid_retries",
    "max_tokens": "max_tokens",
    "logprobs": "no_logprobs",
    "device": "judge_device",
    "dtype": "judge_dtype",
    "batch_size": "judge_batch_size",
    "engine": "engine",
    "kv_cache_gib": "kv_cache_gib",
    "max_string_chars": "max_string_chars",
    "constrained": "unconstrained",
    "base": "student_base",
}


class CheckerConfig(BaseModel):
    """What `build_checker` is given, as data. The flags of `stepgap check`, `label`, `serve`
    and `baseline` are made from these fields (name, default, type, choices, help), and a reward
    worker reads the same keys from a JSON file (`stepgap.serving.process_reward`), so both take the
    same options with the same defaults. No field holds a secret: the API key is read from the
    variable `api_key_env` names."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    judge: str | None = _option(
        None,
        "openai:MODEL (any OpenAI-compatible server), hf:PATH_OR_ID (local causal LM, also a "
        ".gguf file), student:PATH (trained adapter or merged student) or replay:FILE",
        JUDGE,
        metavar="SPEC",
    )
    base_url: str | None = _option(
        None, "openai judge: its server, e.g. http://127.0.0.1:8000/v1", JUDGE
    )
    api_key_env: str = _option(
        "OPENAI_API_KEY",
        "openai judge: environment variable holding the API key (keys are never read from the "
        "command line)",
        JUDGE,
        metavar="NAME",
    )
    response_format: Literal["auto", "json_schema", "json_object", "none"] = _option(
        "auto",
        "openai judge: how to ask for JSON. json_schema (strict; OpenAI, vLLM, SGLang, "
        "llama.cpp), json_object with the schema (llama-cpp-python, Ollama), none (schema in the "
        "prompt); auto tries them in that order until the server takes one",
        JUDGE,
    )
    concurrency: PositiveInt = _option(
        8, "openai judge: requests in flight per checker call", JUDGE
    )
    engine_slots: str = _option(
        "auto",
        "openai judge: requests its server serves at once (not --engine, which is a local "
        "judge's): all checker calls together send it at most "
        "that plus one. auto: what the server says (llama.cpp's /props), else what the "
        "latencies show; a number; none: no limit beyond --concurrency per call",
        JUDGE,
        metavar="auto|N|none",
    )
    max_retries: int = _option(6, "openai judge: API retries (backoff, Retry-After)", JUDGE)
    timeout: float = _option(
        120.0,
        "openai judge: seconds per API request (a served trace's deadline replaces it)",
        JUDGE,
    )
    invalid_retries: int = _option(
        2, "re-asks after a refusal, a truncated answer or schema-violating JSON", JUDGE
    )
    max_tokens: PositiveInt | None = _option(None, "judge answer token budget", JUDGE)
    no_logprobs: bool = _option(False, "do not request token log-probabilities", JUDGE)
    judge_device: str | None = _option(None, "hf judge device (default auto)", JUDGE)
    judge_dtype: str | None = _option(None, "hf judge dtype (float32, bfloat16, ...)", JUDGE)
    judge_batch_size: PositiveInt = _option(8, "hf judge generation batch (HF engine)", JUDGE)
    engine: Literal["auto", "vllm", "hf"] = _option(
        "auto",
        "local judges (hf:, student:, a bundle's student): decode on vLLM's engine in this "
        "process or on transformers; auto: vLLM where it is installed and runs on the judge's "
        "device",
        JUDGE,
    )
    kv_cache_gib: PositiveFloat | None = _option(
        None,
        "vllm engine: GiB of KV cache (default: vLLM's share of the GPU; 2 on CPU)",
        JUDGE,
        metavar="GIB",
    )
    max_string_chars: PositiveInt | None = _option(
        None, "hf judge: cap every free-text field at this many characters", JUDGE
    )
    unconstrained: bool = _option(False, "hf judge: no schema-constrained decoding", JUDGE)
    student_base: str | None = _option(
        None,
        "student judge: base model of the adapter (default: the one in adapter_config.json)",
        JUDGE,
        metavar="ID_OR_PATH",
    )
    cache: str | None = _option(
        None,
        "judge answer cache (SQLite; default $STEPGAP_CACHE or ~/.cache/stepgap/)",
        JUDGE,
        metavar="PATH",
    )
    no_cache: bool = _option(False, "neither read nor write the cache", JUDGE)
    prices: str | None = _option(
        None, "price table JSON {model: {input, cached_input, output}}", JUDGE, metavar="FILE"
    )
    nli: str | None = _option(
        None,
        "replay:FILE, hf:ID_OR_PATH, onnx:EXPORTED_FOLDER or a hub id/path",
        NLI,
        metavar="SPEC",
    )
    device: str | None = _option(None, "NLI device (cpu, cuda, cuda:1; default auto)", NLI)
    bundle: str | None = _option(
        None,
        "offline checker exported by `stepgap export` (no --judge/--nli, no API key)",
        BUNDLE,
        metavar="DIR",
    )
    nli_precision: Literal["fp32", "int8", "fp16"] | None = _option(
        None, "--bundle: which ONNX graph", BUNDLE
    )
    nli_provider: list[str] | None = _option(
        None,
        "--bundle or onnx: NLI: ONNX Runtime execution provider(s) in order of preference, "
        "repeated or a comma list, with provider options after the name, e.g. "
        "CUDAExecutionProvider:device_id=1,CPUExecutionProvider (default: CUDA if available, "
        "then CPU); the bundle's parity probe is re-run on them at load",
        BUNDLE,
        metavar="NAME[:KEY=VALUE...]",
    )
    tree: TreeConfig = Field(default_factory=TreeConfig, exclude=True)  # its own flags

    def judge_options(self, *, online: bool = False) -> dict[str, Any]:
        """The judge fields as keyword arguments of `build_judge`: a field left at its default
        is a `Default` (it goes only to backends that take it), a field set must be taken;
        `online` (a server) goes to backends with an online mode."""
        result: dict[str, Any] = {"online": Default(True)} if online else {}
        for option, name in JUDGE_FIELDS.items():
            value = getattr(self, name)
            if name in ("no_logprobs", "unconstrained"):
                value = not value  # the flags say what is turned off
            left = getattr(self, name) == type(self).model_fields[name].default
            result[option] = Default(value) if left else value
        result["cache"] = False if self.no_cache else self.cache
        result["prices"] = self.prices
        return result

    def require_specs(self) -> None:
        """A ValueError unless this names a checker: a judge and an NLI model, or a bundle."""
        require_specs(self.judge, self.nli, self.bundle)

    def build(self, *, online: bool = False) -> Checker:
        """The hybrid checker of `judge` and `nli` (`build_checker`); `online`: for a server (a
        local judge on vLLM runs its async engine, fed request by request). A configuration
        naming a bundle is loaded by `stepgap.export.offline.load_checker`, which also takes
        one that names specs."""
        from .nli.onnx import parse_providers

        if self.bundle:
            raise ValueError(
                f"bundle={self.bundle!r}: a bundle is loaded by "
                "stepgap.export.offline.load_checker(config)"
            )
        with self.said_in_flags():
            return build_checker(
                self.judge,
                self.nli,
                nli_providers=parse_providers(self.nli_provider),
                tree=self.tree,
                device=self.device,
                judge_options=self.judge_options(online=online),
            )

    @contextlib.contextmanager
    def said_in_flags(self) -> Iterator[None]:
        """A judge option the judge does not take, said in the flags that set it: `--base-url
        does not apply to the judge hf:... (its flags: ...)`."""
        try:
            yield
        except BackendOptionError as exc:
            if exc.option not in JUDGE_FIELDS:
                raise
            flag = "--" + JUDGE_FIELDS[exc.option].replace("_", "-")
            judge = self.judge or f"of --bundle {self.bundle}"
            taken = exc.taken | {ours for ours, local in LOCAL_NAMES.items() if local in exc.taken}
            takes = [f"--{JUDGE_FIELDS[o].replace('_', '-')}" for o in JUDGE_FIELDS if o in taken]
            raise BackendOptionError(
                f"{flag} does not apply to the judge {judge}"
                + (f" (its flags: {', '.join(takes)})" if takes else ""),
                option=exc.option,
                taken=exc.taken,
            ) from None


def build_checker(
    judge: str | JudgeBackend | None = None,
    nli: str | NLIBackend | None = None,
    *,
    tree: TreeConfig | None = None,
    device: str | None = None,
    nli_providers: Sequence[Provider] | None = None,
    judge_options: dict[str, Any] | None = None,
) -> Checker:
    """The hybrid checker from a judge and an NLI model (specs or backends). An exported
    bundle's offline checker is `stepgap.export.offline.OfflineChecker.from_bundle`.

    `device` places the NLI model (an `onnx:` one on the ONNX Runtime provider of that device);
    `judge_options` go to `build_judge`. `nli_providers`: the ONNX Runtime execution providers
    of an `onnx:` NLI model.
    """
    options = dict(judge_options or {})
    require_specs(judge, nli, None)
    from .nli import NLI_BACKENDS, load_nli

    if nli_providers and not (
        isinstance(nli, str) and NLI_BACKENDS.takes(NLI_BACKENDS.parse(nli)[0], "providers")
    ):
        raise ValueError(
            "--nli-provider picks the ONNX Runtime providers of a --bundle or an onnx: NLI model"
        )
    judge_backend = build_judge(judge, **options) if isinstance(judge, str) else judge
    nli_backend = (
        load_nli(nli, device=device, providers=nli_providers) if isinstance(nli, str) else nli
    )
    return Checker(judge_backend, nli_backend, tree)
