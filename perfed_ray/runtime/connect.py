"""Join an existing Ray cluster, shipping this package's code to its workers.

`perfed-ray run --address ADDR` (or `$RAY_ADDRESS`) runs the simulation on a
cluster that is already up, instead of starting a local Ray. The driver's own
copy of `perfed_ray` goes to every worker through Ray's `runtime_env`
(`py_modules`), so the nodes need Ray, PyTorch and the other dependencies but
not this package, and a node with an older copy installed still runs the
driver's code.

A cluster started with token authentication (`RAY_AUTH_MODE=token`, see
cluster/README.md) refuses a client without its token; that, an address where
nothing listens, or a malformed address is the user's input to fix, so it is
reported as one line (an InputError) rather than after Ray's retries and logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import ray
from ray.exceptions import AuthenticationError

from perfed_ray.errors import InputError

PACKAGE = Path(__file__).parents[1]  # perfed_ray/, shipped to the cluster's workers

# Three attempts, not Ray's twenty: once the TCP check has found the GCS listening,
# more attempts cannot fix a refused token, they only delay the message.
_GCS_ATTEMPTS = "RAY_gcs_server_port_wait_time_s"
_REACH_TIMEOUT_S = 5.0
# How a refused token shows when Ray retried under ray.init and gave up.
_REFUSED = ("InvalidAuthToken", "Unauthenticated", "AuthenticationError")


def cluster_address(flag: str | None) -> str | None:
    """The cluster to join: --address, else $RAY_ADDRESS, else none (a local Ray)."""
    return flag or os.environ.get("RAY_ADDRESS") or None


def runtime_env(modules: list[str] = ()) -> dict[str, object]:
    """What every worker of the run needs besides the node's Python: this package, and
    the user's own modules (:func:`perfed_ray.runtime.environment.plugin_modules`)."""
    return {
        "py_modules": [str(PACKAGE), *modules],
        "excludes": ["__pycache__", "*.pyc"],
    }


def connect(address: str, modules: list[str] = ()) -> None:
    """Connect this driver to the Ray cluster at `address` (`auto`, `host:port` or
    `ray://host:port`), shipping this package and `modules`; raises InputError, with
    the fix, when that cannot be done."""
    _check_reachable(address)
    os.environ.setdefault(_GCS_ATTEMPTS, "3")
    with _stderr_kept_if_ok() as failed:
        try:
            ray.init(
                address=address, runtime_env=runtime_env(modules), logging_level=logging.WARNING
            )
        except Exception as err:
            failed()
            raise InputError(_explain(address, err)) from None


def _check_reachable(address: str) -> None:
    """Fail at once where nothing listens, instead of after Ray's 30-second wait."""
    if address == "auto":
        return  # Ray finds the local cluster itself, and says so at once if there is none
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "ray"):
        raise InputError(
            f"--address {address!r} is not a Ray address: use auto, HOST:PORT "
            f"(the head's GCS port, 6379 by default) or ray://HOST:PORT"
        )
    try:
        parts = urlsplit("//" + rest)
        host, port = parts.hostname, parts.port or (10001 if scheme else 6379)
    except ValueError as err:
        raise InputError(f"--address {address!r} is malformed: {err}") from None
    if not host:
        raise InputError(f"--address {address!r} names no host: use HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, port), timeout=_REACH_TIMEOUT_S).close()
    except OSError as err:
        raise InputError(
            f"cannot reach a Ray cluster at {address} ({err.strerror or err}): "
            f"is it up, and is this the head's address and port?"
        ) from None


def _explain(address: str, err: Exception) -> str:
    """One line saying why Ray at `address` would not take this driver, and the fix."""
    detail = f"{err} {err.__cause__}"
    fix = (
        "export RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<the cluster's token> (or put it in "
        "~/.ray/auth_token), see cluster/README.md"
    )
    if os.environ.get("RAY_AUTH_MODE") != "token":
        fix += "; RAY_AUTH_MODE is not 'token' in this shell, so no token was sent"
    if isinstance(err, AuthenticationError) or any(s in detail for s in _REFUSED):
        return f"the Ray cluster at {address} refused this client's token: {fix}"
    first = (str(err).strip() or type(err).__name__).splitlines()[0]
    if address.startswith("ray://"):  # the Ray Client shows a refused token as a timeout
        return (
            f"cannot connect to the Ray client server at {address}: {first}; if the port "
            f"is reachable, the token is missing or wrong: {fix}"
        )
    return f"cannot connect to the Ray cluster at {address}: {first}"


@contextlib.contextmanager
def _stderr_kept_if_ok() -> Iterator[Callable[[], None]]:
    """Hold back what Ray's C++ core writes to stderr while connecting: shown if the
    connection succeeds, dropped if it fails (the caller then prints one line)."""
    sys.stderr.flush()
    saved = os.dup(2)
    dropped = False

    def drop() -> None:
        nonlocal dropped
        dropped = True

    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield drop
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not dropped:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))
                sys.stderr.flush()
