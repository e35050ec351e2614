"""`hf:PATH_OR_ID`: a local causal LM as the judge (a distilled student, SmolLM2, any chat model).

The model answers with its own chat template, in batches. With `constrained=True` (the default)
decoding follows the judge JSON schema through an outlines-core finite-state index, so every
finished answer parses; an answer cut at `max_new_tokens` is reported as a failure, never
guessed. `max_string_chars` bounds the free-text fields (reasoning, quote) when a model rambles.
Stage confidences come from the constrained token probabilities of the decisive fields.
GGUF checkpoints load too (`hf:/path/model.Q4_1.gguf`, dequantized by transformers).

This module loads the model, batches requests, caches answers and parses them; the schema
constraint is `constrained.py`, `generate` in batches and the attention `decoding.py`, the
confidences `confidence.py`, the answer cache `cache.py`.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tqdm.auto import tqdm

from stepgap.models import (
    display_ref,
    load_causal_lm,
    load_chat_tokenizer,
    merged_folder,
    model_config,
    model_identity,
    resolve_model_ref,
    stand_in_note,
)
from stepgap.options import at_least_one, more_than_zero, one_of, option
from stepgap.schema import Judge
from stepgap.tree import JudgeResult

from ..prompt import PROMPT_VERSION
from .base import (
    JUDGE_GROUP,
    JudgeBackend,
    JudgeParseError,
    JudgeRequest,
    JudgeStopped,
    TraceDeadline,
    answer_json_schema,
    answer_params,
    judge_json_schema,
    parse_answer,
    parse_judge,
)
from .cache import JudgeCache, cache_key
from .confidence import stage_confidences
from .constrained import build_index, judge_regex
from .cost import CostMeter
from .decoding import (
    Decoded,
    RowDone,
    attend_grouped,
    auto_batch_size,
    generate_answers,
    tell_finished,
)
from .model_judge import ModelJudgeOptions, with_cache_and_meter
from .vllm_engine import (
    AsyncVLLMEngine,
    VLLMEngine,
    choose_engine,
    engine_args,
    sampling_params,
)

log = logging.getLogger(__name__)

ENGINE_CHUNK = 16  # x 16 = the requests a checker call hands vLLM at once (256)


DEFAULT_MAX_NEW_TOKENS = 768  # a local judge's answer budget when `max_tokens` is not set


@dataclass(frozen=True)
class HFJudgeOptions(ModelJudgeOptions):
    """The options of `hf:PATH_OR_ID`, a local model as the judge (and of the student judges,
    which are local models too)."""

    judge_device: str | None = option(
        None, "local judge: device (cpu, cuda, cuda:1; default auto)", group=JUDGE_GROUP
    )
    judge_dtype: str | None = option(
        None, "local judge: dtype (float32, bfloat16, ...)", group=JUDGE_GROUP
    )
    judge_batch_size: int | None = option(
        8, "local judge: generation batch on transformers (none: by memory)", group=JUDGE_GROUP
    )
    engine: Literal["auto", "vllm", "hf"] = option(
        "auto",
        "local judges (hf:, student:, a bundle's student): decode on vLLM's engine in this "
        "process or on transformers; auto: vLLM where it is installed and runs on the judge's "
        "device",
        group=JUDGE_GROUP,
    )
    kv_cache_gib: float | None = option(
        None,
        "local judge on vLLM: GiB of KV cache (default: vLLM's share of the GPU; 2 on CPU)",
        metavar="GIB",
        group=JUDGE_GROUP,
    )
    max_string_chars: int | None = option(
        None, "local judge: cap every free-text field at this many characters", group=JUDGE_GROUP
    )
    unconstrained: bool = option(
        False, "local judge: no schema-constrained decoding", group=JUDGE_GROUP
    )

    def __post_init__(self) -> None:
        at_least_one("judge_batch_size", self.judge_batch_size)
        at_least_one("max_string_chars", self.max_string_chars)
        more_than_zero("kv_cache_gib", self.kv_cache_gib)
        one_of("engine", self.engine, ("auto", "vllm", "hf"))
        super().__post_init__()


@dataclass(frozen=True)
class StudentJudgeOptions(HFJudgeOptions):
    """The options of `student:PATH` (`stepgap.student.judge`), a local judge trained as a LoRA
    adapter: the base it goes on. Declared here, beside the options of the local judge it
    extends, so that the checker's configuration (`CheckerConfig`) holds them too."""

    student_base: str | None = option(
        None,
        "student judge: base model of the adapter (default: the one in adapter_config.json)",
        metavar="ID_OR_PATH",
        group=JUDGE_GROUP,
    )


class HFJudge(JudgeBackend):
    """Batched greedy generation of judge objects; subclasses change how the model loads, the
    schema it is held to and how an answer is parsed (see `stepgap.student.judge`).

    All pending requests are sorted by prompt length and cut into batches (results come back in
    request order). `batch_size=None` picks the batch by memory (`auto_batch_size`). Each batch
    is one greedy `model.generate` held to the schema (`decoding.generate_answers`), on
    attention that folds grouped key-value heads (`attend_grouped`).

    `engine="vllm"` decodes on vLLM's engine instead (`vllm_engine.py`): the same prompts,
    schema and parsing, every pending request in one engine call (`online=True`: vLLM's async
    engine, fed request by request, for a server); `auto` (the default) takes vLLM where it is
    installed and runs on the judge's device. `kv_cache_gib`: vLLM's KV cache size."""

    name = "hf"

    options_class = HFJudgeOptions

    def __init__(
        self,
        model: str,
        options: HFJudgeOptions | None = None,
        *,
        cache: JudgeCache | None = None,
        meter: CostMeter | None = None,
        on_result: Callable[[JudgeRequest, JudgeResult], None] | None = None,
        online: bool = False,
    ) -> None:
        """`options`: its flags; `cache` and `meter` are made from them by `from_spec`, or
        given here; `online`: vLLM's async engine (a server's judge)."""
        options = options or self.options_class()
        self.options = options
        device, dtype, kv_cache_gib = (
            options.judge_device,
            options.judge_dtype,
            options.kv_cache_gib,
        )
        constrained, max_string_chars = not options.unconstrained, options.max_string_chars
        max_new_tokens = options.max_tokens or DEFAULT_MAX_NEW_TOKENS
        batch_size = options.judge_batch_size
        self.model_ref = model
        self.engine_name = choose_engine(options.engine, device, model)
        self.engine: VLLMEngine | AsyncVLLMEngine | None = None
        self.model: Any = None
        if self.engine_name == "vllm":
            folder, revision = self.vllm_folder(model, dtype)
            self.tokenizer = load_chat_tokenizer(folder, revision)
            self.config = model_config(folder, revision)
            limit = getattr(self.config, "max_position_embeddings", None)
            args = engine_args(
                folder, dtype=dtype, max_model_len=limit, kv_cache_gib=kv_cache_gib,
                revision=revision,
            )  # fmt: skip
            self.engine = (AsyncVLLMEngine if online else VLLMEngine)(args)
            # a checker hands it 16 x this many requests at a time: the engine batches them
            self.concurrency = ENGINE_CHUNK
            if max_string_chars is not None and constrained:
                log.warning(
                    "max_string_chars=%d on vLLM: holding strings to a length costs vLLM's "
                    "structured outputs ten times a decode step's other host work on a large "
                    "vocabulary (bench/vllm_constraint.py); leave it unset on vLLM",
                    max_string_chars,
                )
        else:
            self.tokenizer, self.model = self.load(model, device, dtype)
            attend_grouped(self.model)  # a CPU, a CUDA GPU: padded batches without copied heads
            self.config = self.model.config
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.constrained = constrained
        self.max_string_chars = max_string_chars
        self.regexes: dict[type | None, str] = {}  # per answer schema (None: this judge's)
        self.answer_indexes: dict[type | None, Any] = {}  # their outlines-core indexes (HF)
        self.cache = cache
        self.meter = meter or CostMeter(model=model)
        self.meter.local = True  # tokens are counted, but no API is paid
        self.on_result = on_result
        self.params = {
            "max_new_tokens": max_new_tokens,
            "constrained": constrained,
            "max_string_chars": max_string_chars,
            # the cache keys answers by the model's content, not its name: a retrained student
            # in the same folder must not answer from the old one's cache
            "model_identity": model_identity(model, self.model) if cache is not None else None,
        }

    @classmethod
    def from_spec(cls, arg: str, options: HFJudgeOptions, *, online: bool = False) -> HFJudge:
        """`hf:PATH_OR_ID` (or a student's `student:PATH`) with its answer cache and cost meter
        made from its options."""
        return with_cache_and_meter(cls, arg, options, online=online)

    def load(self, model: str, device: str | None, dtype: str | None) -> tuple[Any, Any]:
        return load_causal_lm(model, device, dtype)

    def vllm_folder(self, model: str, dtype: str | None) -> tuple[str, str | None]:
        """(model folder or hub id, revision) that vLLM loads: a `.gguf` file is dequantized
        into a folder of its own once (`merged_folder`)."""
        ref = resolve_model_ref(model)
        if not ref.endswith(".gguf"):
            return ref, None
        identity = f"{model_identity(ref)}-{dtype or 'float32'}"
        return str(merged_folder(identity, lambda: load_causal_lm(ref, "cpu", dtype))), None

    @property
    def provenance(self) -> dict[str, str | None]:
        """What a verdict says about the judge that decided it (no local paths)."""
        return {
            "spec": f"{self.name}:{display_ref(self.model_ref)}",
            "note": stand_in_note(self.config),
        }

    def schema(self) -> dict[str, Any]:
        """The JSON schema that constrained decoding follows."""
        return judge_json_schema()

    def parse(self, text: str) -> tuple[Judge, dict[str, Any]]:
        """(judge object, anything the answer holds beyond it)."""
        return parse_judge(text), {}

    def answer_regex(self, answer: type | None) -> str | None:
        """The decoding constraint of a request as a regular expression: this judge's schema,
        or the request's own (None when unconstrained)."""
        if not self.constrained:
            return None
        if answer not in self.regexes:
            schema = self.schema() if answer is None else answer_json_schema(answer)
            self.regexes[answer] = judge_regex(self.max_string_chars, schema)
        return self.regexes[answer]

    def answer_index(self, answer: type | None) -> Any:
        """The outlines-core index of a request's constraint (None when unconstrained)."""
        regex = self.answer_regex(answer)
        if regex is None:
            return None
        if answer not in self.answer_indexes:
            self.answer_indexes[answer] = build_index(self.tokenizer, regex)
        return self.answer_indexes[answer]

    def judge(
        self, requests: Sequence[JudgeRequest], *, stop: threading.Event | None = None
    ) -> list[JudgeResult]:
        """Judge every request; results in request order. `stop`, set from another thread, ends
        the call (`JudgeStopped`); on vLLM's async engine its requests are aborted at once."""
        results: list[JudgeResult | None] = [None] * len(requests)
        keys = [
            cache_key(
                self.name, self.model_ref, PROMPT_VERSION, {**self.params, **answer_params(r)}, r
            )
            for r in requests
        ]
        todo = []
        for i, (request, key) in enumerate(zip(requests, keys, strict=True)):
            hit = self.cache.get(key, request.answer) if self.cache is not None else None
            if hit is not None:
                self.meter.hit()
                results[i] = JudgeResult(judge=hit.judge, confidences=hit.confidences)
                self._report(request, results[i])
            else:
                todo.append(i)
        prompts = {i: self.prompt_ids(requests[i]) for i in todo}
        # all steps of all traces at once, similar lengths sharing a batch (less padding)
        todo.sort(key=lambda i: -len(prompts[i]))
        if self.engine is not None:  # the engine batches (and shares prefixes) by itself
            size = max(1, len(todo))
        else:
            longest = max((len(p) for p in prompts.values()), default=1)
            size = self.batch_size or self.rows_by_memory(longest)
        with _judge_bar(len(todo), f"{self.name} judge") as bar:

            def finish(i: int, d: Decoded | str) -> None:
                results[i] = self._finished(requests[i], keys[i], prompts[i], d)
                bar.update(1)

            for batch in (todo[k : k + size] for k in range(0, len(todo), size)):
                if stop is not None and stop.is_set():
                    raise JudgeStopped("the judge call was stopped")
                self.generate_ids(
                    [prompts[i] for i in batch],
                    [requests[i].answer for i in batch],
                    [requests[i].deadline for i in batch],
                    stop,
                    on_row=lambda r, d, batch=batch: finish(batch[r], d),  # each row as it ends
                )
        return results  # type: ignore[return-value]

    def _finished(
        self, request: JudgeRequest, key: str, prompt: Sequence[int], d: Decoded | str
    ) -> JudgeResult:
        """The result of one decoded answer (or why there is none), cached when it is a judge
        object, counted when it failed, and reported to `on_result` as it comes."""
        result = (
            JudgeResult.failed(d)
            if isinstance(d, str)
            else self.answer_result(d, len(prompt), request.answer)
        )
        if result.judge is not None and self.cache is not None:
            self.cache.put(key, self.model_ref, result)
        if result.judge is None:
            self.meter.failed()
        self._report(request, result)
        return result

    def rows_by_memory(self, longest_prompt: int) -> int:
        """The batch that fits in memory for prompts of up to `longest_prompt` tokens and
        their answers (what `batch_size=None` picks)."""
        return auto_batch_size(self.model, longest_prompt + self.max_new_tokens)

    def prompt_ids(self, request: JudgeRequest) -> list[int]:
        """The token ids of a request's chat prompt, ready for the answer."""
        text = self.tokenizer.apply_chat_template(
            request.messages, add_generation_prompt=True, tokenize=False
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _report(self, request: JudgeRequest, result: JudgeResult) -> None:
        if self.on_result is not None:
            self.on_result(request, result)

    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        answers: Sequence[type | None] | None = None,
        deadlines: Sequence[TraceDeadline | None] | None = None,
        stop: threading.Event | None = None,
        on_row: RowDone | None = None,
    ) -> list[Decoded | str]:
        """Greedy answers of one batch of tokenized prompts, each held to its request's schema;
        on vLLM's async engine, a request whose trace is no longer wanted gets the reason
        instead (aborted in the engine). `stop` ends the batch at its next token; `on_row` is
        told of each row once, as it finishes."""
        answers = answers if answers is not None else [None] * len(prompts)
        eos = self.tokenizer.eos_token_id
        if self.engine is not None:
            params = [
                sampling_params(self.max_new_tokens, self.answer_regex(a), eos) for a in answers
            ]
            decoded = self.engine.generate(prompts, params, deadlines, stop, eos)
            tell_finished(on_row, decoded)
            return decoded
        indexes = [self.answer_index(a) for a in answers]
        return generate_answers(  # type: ignore[return-value]
            self.model, self.tokenizer, prompts, indexes, self.max_new_tokens, stop, on_row
        )

    @property
    def online(self) -> bool:
        """On vLLM's async engine in this process (`online=True`), fed request by request."""
        return self.engine is not None and self.engine.online

    def close(self) -> None:
        """Shut the vLLM engine down (nothing to do for HF)."""
        if self.engine is not None:
            self.engine.close()

    def answer_result(
        self, decoded: Decoded, prompt_tokens: int, answer: type | None
    ) -> JudgeResult:
        """The judge object (or the failure) of one decoded answer, with stage confidences."""
        eos = self.tokenizer.eos_token_id
        ids = decoded.tokens
        finished = bool(ids) and ids[-1] == eos
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids)}
        self.meter.add(usage)
        if not finished:
            return JudgeResult.failed(
                f"the answer was truncated at max_new_tokens={self.max_new_tokens}", usage
            )
        body = ids[:-1]
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        try:
            judge, extra = self.parse(text) if answer is None else (parse_answer(text, answer), {})
        except JudgeParseError as exc:
            return JudgeResult.failed(str(exc), usage)
        conf: dict[str, float] = {}
        if answer is None:  # stage fields of the judge schema only
            tokens = [
                (self.tokenizer.decode([t]), lp)
                for t, lp in zip(body, decoded.logprobs, strict=False)
            ]
            conf = {s: p for s, p in stage_confidences(tokens).items() if math.isfinite(p)}
        return JudgeResult(judge=judge, confidences=conf, usage=usage, extra=extra)


def _judge_bar(total: int, desc: str) -> tqdm:
    """The judge's own bar below a command's: on a terminal only, gone when its call ends, and
    off with the libraries' bars (`--no-progress` turns off the Hub's)."""
    from huggingface_hub.utils import are_progress_bars_disabled

    hide = True if are_progress_bars_disabled() else None  # None: off unless on a terminal
    return tqdm(total=total, desc=desc, unit="step", disable=hide, leave=False)
