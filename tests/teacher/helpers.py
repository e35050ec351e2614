"""Small builders for judge objects and steps used across the teacher tests."""

from __future__ import annotations

from stepgap.schema import Judge, NLIProbs, Snippet, Step
from stepgap.tree import JudgeResult


def judge(
    *,
    off: bool = False,
    drift: str = "none",
    abstain: bool = False,
    accurate: bool = False,
    entity: bool = True,
    found: bool = False,
    quote: str = "",
) -> Judge:
    return Judge.model_validate(
        {
            "step_minus1_alignment": {
                "is_off_target": off,
                "drift_type": drift,
                "alignment_reasoning": "a",
            },
            "step_0_abstention_check": {
                "is_abstention_step": abstain,
                "abstention_is_accurate": accurate,
                "abstention_reasoning": "b",
            },
            "step_1_quote_search": {
                "entity_match": entity,
                "entity_match_reasoning": "c",
                "found_quote": found,
                "evidence_quote": quote,
                "quote_search_reasoning": "d",
            },
        }
    )


def ok(j: Judge, **conf: float) -> JudgeResult:
    return JudgeResult(judge=j, confidences=conf)


def inference(index: int, claim: str, *texts: str, title: str = "T") -> Step:
    return Step(
        index=index,
        type="inference",
        claim=claim,
        query="q",
        evidence=[Snippet(title=title, text=t) for t in texts],
    )


def conclusion(index: int, answer: str, claim: str = "so") -> Step:
    return Step(index=index, type="conclusion", claim=claim, answer=answer)


def probs(e: float, n: float, c: float) -> NLIProbs:
    return NLIProbs(entailment=e, neutral=n, contradiction=c)


class TableNLI:
    """An NLI function answering from a {premise: probs} table and recording each pair asked."""

    def __init__(self, table: dict[str, NLIProbs], default: NLIProbs | None = None) -> None:
        self.table = table
        self.default = default or probs(0.1, 0.8, 0.1)
        self.asked: list[tuple[str, str]] = []

    def __call__(self, pairs):
        self.asked.extend(pairs)
        return [self.table.get(p, self.default) for p, _ in pairs]
