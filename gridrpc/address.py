"""Addresses of agents as users type them: one parser for every command.

Accepted forms (what ``--ma``, ``--parent``, ``GRIDRPC_MA`` and
``gridrpc loadtest`` take)::

    127.0.0.1:5555          -> tcp://127.0.0.1:5555
    node1.example.org:5555  -> tcp://node1.example.org:5555
    [::1]:5555              -> tcp://[::1]:5555
    tcp://host:port         (as is, after checking the port)
    ipc:///tmp/gridrpc.sock (as is)
    inproc://name           (as is; same process only)

Anything else is a :class:`~gridrpc.errors.ConfigError` that says what was
expected. ``GRIDRPC_MA`` and ``--ma`` may list several master agents,
comma-separated (:func:`parse_addresses`).
"""
from __future__ import annotations

import re

from .errors import ConfigError

__all__ = ["parse_address", "parse_addresses", "EXPECTED"]

EXPECTED = "expected host:port, tcp://host:port or ipc:///path"
_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-*]+)"
_HOST_PORT = re.compile(rf"({_HOST}):(\d{{1,5}})")


def parse_address(text: object, *, what: str = "address", allow_any_port: bool = False) -> str:
    """One address in any accepted form -> its ZeroMQ form (``tcp://host:port``,
    ``ipc://path``, ``inproc://name``). ``allow_any_port``: accept port 0 (bind
    to a free port)."""
    if not isinstance(text, str):
        raise ConfigError(f"{what}: {text!r} is not an address ({EXPECTED})")
    s = text.strip()
    if not s:
        raise ConfigError(f"{what}: empty address ({EXPECTED})")
    scheme, sep, rest = s.partition("://")
    if not sep:
        scheme, rest = "tcp", s
    scheme = scheme.lower()
    if scheme in ("ipc", "inproc"):
        if not rest:
            raise ConfigError(f"{what}: {text!r} has no path after {scheme}:// ({EXPECTED})")
        return f"{scheme}://{rest}"
    if scheme != "tcp":
        raise ConfigError(f"{what}: {text!r}: unknown scheme {scheme!r}:// ({EXPECTED})")
    m = _HOST_PORT.fullmatch(rest)
    if not m:
        hint = " (the port is missing)" if re.fullmatch(_HOST, rest) else ""
        raise ConfigError(f"{what}: {text!r} is not an address{hint} ({EXPECTED})")
    port, lowest = int(m.group(2)), 0 if allow_any_port else 1
    if not lowest <= port <= 65535:
        raise ConfigError(f"{what}: {text!r}: port {port} out of range ({lowest}-65535; {EXPECTED})")
    return f"tcp://{m.group(1)}:{port}"


def parse_addresses(text: object, *, what: str = "address") -> list[str]:
    """A comma-separated list of addresses (``GRIDRPC_MA=a:5555,b:5555``)."""
    if isinstance(text, (list, tuple)):
        parts = [str(p) for p in text]
    elif isinstance(text, str):
        parts = [p for p in text.split(",") if p.strip()]
    else:
        raise ConfigError(f"{what}: {text!r} is not an address ({EXPECTED})")
    if not parts:
        raise ConfigError(f"{what}: no address given ({EXPECTED})")
    return [parse_address(p, what=what) for p in parts]
