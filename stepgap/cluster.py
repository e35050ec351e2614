"""Joining a Ray cluster, or saying in one line why not.

`--ray` (labeling, checking, serving) runs on Ray, which is an extra: without it installed, the
flag is one error that names the extra. A cluster address that nothing answers makes `ray.init`
retry for minutes; `connect` first opens a TCP connection to it with a timeout, so an unreachable
cluster is one error after a few seconds instead.
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from typing import Any

RAY_EXTRA = "pip install 'stepgap[ray]'"


class ClusterError(RuntimeError):
    """Ray is missing, or the cluster cannot be joined."""


def require_ray() -> Any:
    """The `ray` module, or a ClusterError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ClusterError(f"--ray needs Ray, which is not installed: {RAY_EXTRA}") from None
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of `HOST:PORT` or `ray://HOST:PORT`; None for `auto` or no address."""
    if not address or address in ("auto", "local"):
        return None
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"--ray {address}: expected HOST:PORT, ray://HOST:PORT or auto")
    return host.strip("[]") or "127.0.0.1", int(port)


def connect(
    address: str | None = None, *, timeout: float = 10.0, env_vars: dict[str, str] | None = None
) -> Any:
    """Join the Ray cluster at `address` (default `$RAY_ADDRESS`, else a new local one) unless
    this process has joined one already; returns the `ray` module. `env_vars` reach every
    worker the job starts (the judge's API key variable, read from this process's
    environment)."""
    ray = require_ray()
    address = address or os.environ.get("RAY_ADDRESS") or None
    where = _host_port(address) if address else None
    if where is not None:
        try:
            socket.create_connection(where, timeout=timeout).close()
        except OSError as exc:
            raise ClusterError(
                f"cannot reach the Ray cluster at {address} ({exc or 'timed out'}); start it "
                "with `ray start --head` or give the head node's address"
            ) from None
    if ray.is_initialized():
        return ray
    runtime_env = {"env_vars": dict(env_vars)} if env_vars else None
    try:
        with warnings.catch_warnings():  # a tip about a future default, nothing to act on
            warnings.filterwarnings("ignore", "Tip: In future versions of Ray", FutureWarning)
            ray.init(
                address=address,
                runtime_env=runtime_env,
                log_to_driver=False,
                logging_level=logging.WARNING,
                include_dashboard=False if address is None else None,
            )
    except ConnectionError as exc:
        raise ClusterError(f"cannot join the Ray cluster at {address or 'auto'}: {exc}") from None
    return ray
