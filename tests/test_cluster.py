"""`--ray` without Ray installed, or with a cluster nothing answers: one clear line, no hang."""

from __future__ import annotations

import socket
import sys

import pytest

from stepgap.cli import main
from stepgap.cluster import ClusterError, connect


def _check(examples_dir, tmp_path, *ray):
    return ["check", str(examples_dir / "traces.jsonl"), "-o", str(tmp_path / "v.jsonl"),
            "--judge", f"replay:{examples_dir / 'judge_replay.jsonl'}",
            "--nli", f"replay:{examples_dir / 'nli_replay.jsonl'}", *ray]  # fmt: skip


def test_without_ray_the_flag_names_the_extra(monkeypatch, examples_dir, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    assert main(_check(examples_dir, tmp_path, "--ray")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stepgap check: error: --ray needs Ray, which is not installed: "
                   "pip install 'stepgap[ray]'"]  # fmt: skip
    assert not (tmp_path / "v.jsonl").exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_cluster_is_one_error_after_one_try(
    examples_dir, tmp_path, capsys, monkeypatch
):
    """A closed port: one connection attempt, then one line; no retries (Ray's own join would
    retry for minutes)."""
    address = f"127.0.0.1:{_closed_port()}"
    tries = []
    real = socket.create_connection
    monkeypatch.setattr(
        socket, "create_connection", lambda *a, **k: (tries.append(a), real(*a, **k))[1]
    )
    assert main(_check(examples_dir, tmp_path, "--ray", address)) == 2
    assert len(tries) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"stepgap check: error: cannot reach the Ray "
                                                f"cluster at {address}")  # fmt: skip


def test_a_silent_address_times_out_instead_of_hanging(monkeypatch):
    asked = []

    def silent(address, timeout):  # a host that never answers: the connect times out
        asked.append((address, timeout))
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent)
    with pytest.raises(ClusterError, match=r"cannot reach the Ray cluster at 10\.1\.2\.3:6379"):
        connect("10.1.2.3:6379", timeout=0.3)
    assert asked == [(("10.1.2.3", 6379), 0.3)]  # one attempt, bounded by its timeout


@pytest.mark.parametrize("address", ["head", "head:port", "ray://:x"])
def test_an_address_that_is_no_host_and_port_is_refused(address):
    with pytest.raises(ClusterError, match="expected HOST:PORT"):
        connect(address)
