"""Session-wide fixtures: tiny real-architecture models (built once) and the shipped examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures import models

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    """Path of a tiny random Qwen2 causal LM with the real Qwen vocabulary."""
    return models.build_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session")
def tiny_nli(tmp_path_factory) -> Path:
    """Path of a tiny random DebertaV2 NLI model, labels in MoritzLaurer's order."""
    return models.build_deberta_nli(tmp_path_factory.mktemp("tiny-nli"))


@pytest.fixture(scope="session")
def tiny_nli_cross_encoder_order(tmp_path_factory, tiny_nli) -> Path:
    """The same model as `tiny_nli` with the cross-encoder label order (rows permuted)."""
    return models.build_deberta_nli(
        tmp_path_factory.mktemp("tiny-nli-ce"),
        order=models.NLI_ORDERS["cross-encoder"],
        permute_from=tiny_nli,
    )
