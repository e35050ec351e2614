"""Secrets from the environment are masked in log records and error text."""

from __future__ import annotations

import logging

from stepgap.redact import MASK, RedactingFilter, redact


def test_env_secrets_are_masked_in_text_and_log_records(monkeypatch, caplog):
    monkeypatch.setenv("MY_SERVICE_API_KEY", "canary-123456789")
    monkeypatch.setenv("HF_TOKEN", "hf_canaryABCDEFGH")
    monkeypatch.setenv("HOME_DIR_NAME", "not-a-secret-value")
    assert redact("key=canary-123456789 tok=hf_canaryABCDEFGH") == f"key={MASK} tok={MASK}"
    assert redact("not-a-secret-value") == "not-a-secret-value"
    log = logging.getLogger("stepgap.test")
    caplog.handler.addFilter(RedactingFilter())
    with caplog.at_level(logging.INFO, logger="stepgap.test"):
        log.info("sending %s to %s", "canary-123456789", "server")
    assert "canary-123456789" not in caplog.text and f"sending {MASK} to server" in caplog.text


def test_short_values_are_not_treated_as_secrets(monkeypatch):
    monkeypatch.setenv("X_TOKEN", "abc")  # too short to mask without mangling ordinary text
    assert redact("abc def") == "abc def"
