"""Search-R1's retrieval server for a local index (`stepgap serve-index`): `POST /retrieve`
answers as `search_r1/search/retrieval_server.py` does (the protocol: `data_builders/retrieval.py`),
so a search agent's tool (veRL's, OpenRLHF's, TRL's, `stepgap rollouts`) asks it as it would ask
Search-R1's E5/FAISS server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from stepgap.data_builders.retrieval import LocalIndex, Retriever


class QueryRequest(BaseModel):
    """`POST /retrieve`'s body: retrieval_server.py's request model, field for field."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def create_app(retriever: Retriever, default_topk: int = 3) -> Any:
    """A FastAPI app answering Search-R1's `POST /retrieve` (and `GET /health`)."""
    from fastapi import FastAPI

    app = FastAPI(title="stepgap retrieval server (Search-R1 protocol)")

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict[str, Any]:
        hits = retriever.search(request.queries, request.topk or default_topk)
        if request.return_scores:
            return {
                "result": [[{"document": h.document, "score": h.score} for h in r] for r in hits]
            }
        return {"result": [[h.document for h in r] for r in hits]}

    @app.get("/health")
    def health() -> dict[str, Any]:
        meta = retriever.meta
        return {"status": "ok", "documents": meta.get("documents"), "kind": meta.get("kind")}

    return app


def serve_index(
    index: str | Path, *, host: str = "127.0.0.1", port: int = 8000, topk: int = 3
) -> None:
    """Serve a local index over HTTP with Search-R1's protocol until interrupted."""
    import uvicorn

    uvicorn.run(create_app(LocalIndex(index), topk), host=host, port=port, log_level="warning")
