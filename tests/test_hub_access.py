"""stepgap/hub_access.py: an upload that fails is one line, whichever HTTP client
huggingface_hub runs on (requests before 1.0, httpx in 1.x, httpx2 in 2.x)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from stepgap.hub_access import HubUploadError, upload_errors


@contextmanager
def _dropping_hub() -> Iterator[str]:
    """A Hub endpoint on 127.0.0.1 that takes each connection and closes it unanswered."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)


def test_an_upload_whose_connection_drops_is_one_line():
    """The HTTP client's own error (not the Hub's HfHubHTTPError: no answer came) becomes one
    `HubUploadError` naming what failed and what to do, not a traceback."""
    from huggingface_hub import HfApi

    with _dropping_hub() as endpoint:
        api = HfApi(endpoint=endpoint, token="hf_not_a_real_token")
        with pytest.raises(HubUploadError) as raised:
            with upload_errors("pushing me/stepgap-tiny"):
                api.create_repo("me/stepgap-tiny", exist_ok=True)
    message = str(raised.value)
    assert message.startswith("pushing me/stepgap-tiny failed: ") and "\n" not in message
    assert "hf_not_a_real_token" not in message
