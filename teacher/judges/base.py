"""The judge interface (stages A-C): chat prompts in, validated judge objects out.

A backend never guesses: an answer that is not a schema-valid judge object becomes a
`JudgeResult` with `error` set, and the tree turns that into a verdict with no label.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from stepgap.clock import TraceDeadline
from stepgap.options import Options
from stepgap.registry import Backend
from stepgap.schema import Judge, Step, StepType
from stepgap.tree import JudgeResult

from .concurrency import EngineLimit
from .cost import CostMeter

#: the group of the judge's flags in `--help`
JUDGE_GROUP = "judge (stages A-C)"

Messages = list[dict[str, str]]


class StepData:
    """The step a request asks about, as data: what its prompt is made from (the question, the
    step with its claim, query, answer and evidence, the steps before it, a student's NLI
    features), so that a judge that reads the step needs not parse the prompt back.

    The steps after it are not shown (a request reads the steps up to its own, as its prompt
    does, so a rollout's step can be asked about before the rollout ends); the earlier steps
    are all there, where the prompt keeps the most recent evidence within its budget."""

    __slots__ = ("question", "_steps", "position", "nli_features")

    def __init__(
        self,
        question: str,
        steps: Sequence[Step],
        position: int,
        nli_features: Sequence[dict[str, object]] | None = None,
    ) -> None:
        self.question = question
        self._steps = steps  # the trace's list as it is: no copy per request (long traces)
        self.position = position  # the step's place in the trace's steps
        self.nli_features = nli_features

    @property
    def step(self) -> Step:
        """The step itself: `claim`, `query`, `answer`, `evidence` (its snippets), `type`."""
        return self._steps[self.position]

    @property
    def earlier(self) -> list[Step]:
        """The steps before it, in trace order."""
        return list(self._steps[: self.position])

    def __repr__(self) -> str:
        return f"StepData(question={self.question!r}, step={self.step.index})"


@dataclass
class JudgeRequest:
    """One step to judge: who it is (for replay and caching), the prompt to send, and the step
    as data (`step_data`: what the prompt is made from)."""

    trace_id: str
    step: int
    step_type: StepType
    messages: Messages
    # The answer schema when it is not the teacher's judge object (a prompt-only baseline's):
    # backends that can hold decoding to a schema answer in it; the others refuse the request.
    answer: type[BaseModel] | None = None
    # When the trace's answer stops being worth anything (the reward server's deadline, a
    # client that left); a judge that sends requests honours it. Not part of the prompt.
    deadline: TraceDeadline | None = field(default=None, compare=False, repr=False)
    # The step the prompt asks about, as data (None: a request made from messages alone). The
    # prompt already says all of it: it is no part of a request's equality or cache key.
    step_data: StepData | None = field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        """What the request costs a judge, as its prompt's characters: what a reward server
        paces by."""
        return sum(len(str(m.get("content") or "")) for m in self.messages)


ResultHook = Callable[[JudgeRequest, JudgeResult], None]


class JudgeBackend(Backend):
    """A judge of stages A-C: prompts in, judge objects out, one per request, in order.

    `judge` is the one method a backend must write. Everything else a caller reads has a
    default here that a backend overrides where it differs (in the manner of
    lm-evaluation-harness's `LM`): a plain backend is a class with a `name` and a `judge`. A
    spec `KIND:ARG` builds it with `from_spec` (`cls(ARG, options)` by default), its options
    an instance of its `options_class` (none by default)."""

    #: the spec kind (`openai`, `hf`, ...), also the default provenance
    name: str = "judge"
    #: a student trained with each step's NLI features in its prompt (the checker adds them)
    nli_features: bool = False
    #: a student's prompt budget for earlier steps' evidence, in characters (None: the
    #: teacher's prompt)
    earlier_evidence_chars: int | None = None
    #: requests it keeps in flight within one call (a checker's streams size their chunks by it)
    concurrency: int = 1
    #: called with (request, result) as each answer arrives, before the call returns; a
    #: backend that reports answers early calls it (None: answers come with the return value)
    on_result: ResultHook | None = None
    #: its count of calls, cache hits, tokens and cost, where it keeps one
    meter: CostMeter | None = None
    #: the server it sends requests to (None: a model in this process, or stored answers)
    base_url: str | None = None
    #: its server's slots, learned and measured (an OpenAI-compatible engine), where known
    limit: EngineLimit | None = None

    @classmethod
    def from_spec(cls, arg: str, options: Options, *, online: bool = False) -> JudgeBackend:
        """The judge a spec `KIND:ARG` names, with its options. `online`: it serves a server's
        requests one by one (a local model on vLLM runs its async engine); most judges do not
        care. `cls(arg, options)` by default."""
        return cls(arg, options)  # type: ignore[call-arg]

    @abstractmethod
    def judge(
        self, requests: Sequence[JudgeRequest], *, stop: threading.Event | None = None
    ) -> list[JudgeResult]:
        """A result per request, in request order; a request it could not answer is a result
        with `error` set, never a guess. `stop`, set from another thread, ends the call early
        (`JudgeStopped`); a backend that cannot stop mid-call stops at its next answer."""

    @property
    def provenance(self) -> dict[str, str | None]:
        """What a verdict records of this judge (`Verdict.checker`): its spec and a note."""
        return {"spec": self.name, "note": None}

    @property
    def online(self) -> bool:
        """Whether it serves requests one by one on an engine in this process that batches
        across calls (vLLM's async engine), so a server may keep many calls in flight."""
        return False

    def close(self) -> None:
        """Free what it holds (a vLLM engine, its processes and GPU memory) before the next
        model needs that memory or the process exits; nothing, by default."""
        return None  # noqa: B027 - a default, not an abstract method


def close_judge(judge: JudgeBackend | None) -> None:
    """`judge.close()`, for a judge that may be absent (a remote checker has none)."""
    if judge is not None:
        judge.close()


class JudgeConfigError(RuntimeError):
    """The judge cannot work at all (credentials, model name): stop, do not label errors."""


class JudgeStopped(Exception):
    """A judge call ended early because its caller stopped it (nobody waits for its answers)."""


class JudgeParseError(ValueError):
    """The judge's text is not a schema-valid judge object."""


def parse_judge(text: str) -> Judge:
    """Parse and validate a judge answer; a fenced ```json block is accepted, and raw control
    characters inside strings (as llama-cpp-python's server writes them), nothing looser."""
    return parse_answer(text, Judge)  # type: ignore[return-value]


def parse_answer(text: str, model: type[BaseModel]) -> BaseModel:
    """`parse_judge` for any answer schema (`JudgeRequest.answer`)."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    try:
        obj = json.loads(body, strict=False)  # a raw newline or tab inside a string is read
    except json.JSONDecodeError as exc:
        raise JudgeParseError(f"judge answer is not JSON ({exc.msg} at char {exc.pos})") from None
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise JudgeParseError(
            f"judge answer violates the schema at {loc or '<root>'}: {first['msg']}"
            + (f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else "")
        ) from None


def judge_json_schema() -> dict[str, Any]:
    """The judge object as a JSON schema for OpenAI strict structured output."""
    return answer_json_schema(Judge)


def answer_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """An answer model as a JSON schema for strict structured output and constrained decoding.

    Strict mode wants every object closed (`additionalProperties: false`), every property
    required and no `$ref`, so the pydantic schema is inlined.
    """
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]]))
            node = {k: inline(v) for k, v in node.items() if k != "title"}
            if node.get("type") == "object":
                node["additionalProperties"] = False
                node["required"] = list(node.get("properties", {}))
            return node
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)


def answer_params(request: JudgeRequest) -> dict[str, str]:
    """What a cache key adds for a request's own answer schema (nothing for the teacher's, so
    existing keys stay valid): its name and a hash of its JSON schema."""
    if request.answer is None:
        return {}
    schema = json.dumps(answer_json_schema(request.answer), sort_keys=True)
    digest = hashlib.sha256(schema.encode()).hexdigest()[:12]
    return {"answer": f"{request.answer.__name__}:{digest}"}


def require_judge_schema(backend: str, requests: Sequence[JudgeRequest]) -> None:
    """Refuse requests for another answer schema, for a backend that can only give judge
    objects (stored answers), instead of answering them in the wrong schema."""
    for r in requests:
        if r.answer is not None:
            raise JudgeConfigError(
                f"the {backend} judge only holds the teacher's judge objects (stages A-C); it "
                f"cannot answer in the {r.answer.__name__} schema that trace {r.trace_id!r} "
                f"step {r.step} asks for: use a model judge (openai:MODEL, hf:PATH)"
            )


def response_format(schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `response_format` argument for chat completions with a strict schema (by default the
    teacher's judge schema)."""
    schema = schema if schema is not None else judge_json_schema()
    return {
        "type": "json_schema",
        "json_schema": {"name": "stepgap_judge", "strict": True, "schema": schema},
    }
