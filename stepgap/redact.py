"""Keep credentials out of logs and error messages.

Secrets come from the environment only. Every value of an environment variable whose name looks
like a credential (…KEY, …TOKEN, …SECRET, …PASSWORD) is replaced by `***` in log records and in
any error text that stepgap writes to a verdict, a log or stderr.
"""

from __future__ import annotations

import logging
import os
import re

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)
MASK = "***"


def secret_values() -> list[str]:
    """Credential-looking environment values, longest first (8 characters or more)."""
    values = {v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= 8}
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    for value in secret_values():
        text = text.replace(value, MASK)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites a record's final message with secrets masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install_redaction(logger: logging.Logger | None = None) -> None:
    """Attach the filter to every handler of `logger` (root by default), once."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
