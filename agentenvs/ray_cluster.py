"""Joining a Ray cluster, for the studies' sweeps and the environment actors (optional extra).

Ray is optional: this module imports it only inside its functions, and a missing install gets
the project's one missing-extra message (:func:`hgpo.extras.require_extras`: ``<where> needs
ray (the [ray] extra); install it with pip install -e ".[ray]"``). Where the cluster is:

- an address ``host:port`` (a ``ray start --head`` node's GCS port, 6379 by default) or
  ``ray://host:port`` (Ray Client): join that cluster;
- ``auto``: join the cluster that ``ray start`` last started on this machine;
- empty: ``$RAY_ADDRESS`` when set (``ray job submit`` sets it), else start a private Ray
  instance on this machine, stopped again at the end.

An explicit empty address never falls back to Ray's ``ray_current_cluster`` file, so a file left
behind by a dead cluster cannot make a run wait on it. Ray itself waits minutes for an address
where nothing answers; :func:`check_address` tries a plain TCP connection first and fails within
``timeout_s`` with an error naming the address.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from hgpo.extras import MissingExtraError, missing_extras_message, require_extras
from hgpo.options import OptionError, bad

__all__ = ["check_address", "ensure_ray", "import_ray", "ray_session", "require_ray"]

CLIENT_PORT = 10001
"""Ray Client's default port, for ``ray://host`` without one."""


def import_ray(where: str) -> ModuleType:
    """The ``ray`` module, or a :class:`hgpo.extras.MissingExtraError` (an OptionError) naming
    ``where`` and the install command; a Ray that is there but fails to import says why too."""
    require_ray(where)
    try:
        import ray
    except ImportError as e:
        message = missing_extras_message(where, {"ray": ("ray",)})
        raise MissingExtraError(f"{message} (importing it failed: {e})") from None
    return ray


def require_ray(where: str) -> None:
    """Fail (naming ``where`` and the install command) unless Ray is installed; cheap: it does
    not import Ray, so configs can check it before any heavy work."""
    require_extras(where, "ray")


def resolve_address(address: str) -> str:
    """The address to join: ``address``, else ``$RAY_ADDRESS``, else "" (start Ray here)."""
    return address or os.environ.get("RAY_ADDRESS", "")


def _host_port(where: str, address: str) -> tuple[str, int]:
    """ "ray://h:p" / "h:p" / "auto" -> (host, port); "auto" reads what `ray start` left."""
    if address == "auto":
        import_ray(where)
        from ray._private.utils import read_ray_address

        found = read_ray_address()
        if not found:
            raise bad(where, "a running cluster ('ray start --head' found none here)", address)
        address = found
    client = address.startswith("ray://")
    rest = address[len("ray://") :] if client else address
    host, sep, port = rest.rpartition(":")
    if not sep:
        host, port = rest, str(CLIENT_PORT) if client else ""
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad(where, "host:port, ray://host:port or auto", address)
    return host.strip("[]"), int(port)


def check_address(where: str, address: str, timeout_s: float = 10.0) -> None:
    """Fail fast (within ``timeout_s``) unless something listens at the cluster address.

    An empty address (start Ray here) always passes. Raises :class:`OptionError` naming
    ``where``, the address and the reason (e.g. "connection refused").
    """
    address = resolve_address(address)
    if not address:
        return
    host, port = _host_port(where, address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        reason = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise OptionError(
            f"{where}: must be the address of a running Ray cluster, got {address!r} "
            f"({reason} at {host}:{port}); start one with `ray start --head` on that machine"
        ) from None


def _init(ray: ModuleType, address: str, num_cpus: int | None) -> None:
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        # "local" (not None) so that Ray does not read a stale ray_current_cluster file.
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )


@contextmanager
def ray_session(where: str, address: str = "", num_cpus: int | None = None) -> Iterator[ModuleType]:
    """Ray connected for the ``with`` block; shut down after it unless it was already running.

    address: see the module docstring ("" starts a private instance with ``num_cpus`` CPUs).
    """
    ray = import_ray(where)
    if ray.is_initialized():  # the caller's session (a test's cluster, a notebook): keep it
        yield ray
        return
    address = resolve_address(address)
    check_address(where, address)
    _init(ray, address, num_cpus)
    try:
        yield ray
    finally:
        ray.shutdown()


def ensure_ray(where: str, address: str = "") -> ModuleType:
    """Ray connected for the rest of the process (environment actors live as long as it).

    Joins ``address`` (or ``$RAY_ADDRESS``) or starts Ray on this machine; Ray shuts itself down
    at exit.
    """
    ray = import_ray(where)
    if not ray.is_initialized():
        address = resolve_address(address)
        check_address(where, address)
        _init(ray, address, None)
    return ray
