"""Small blocking client of the MA's HTTP API for ``gridrpc top`` and
``gridrpc events`` (stdlib only: urllib).

``--ma`` names the MA's HTTP API: ``http://HOST:PORT`` (or ``https://``),
or ``HOST:PORT``. Default: ``$GRIDRPC_MA_HTTP``, else ``http://127.0.0.1:8080``.
A ZeroMQ address (``tcp://HOST:PORT``, what ``GRIDRPC_MA`` holds) is accepted
when the MA publishes its HTTP URL in its tree entry (``"http"``): it is then
asked over ZeroMQ once.
"""
from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator

DEFAULT_HTTP = "http://127.0.0.1:8080"
_HOSTPORT = re.compile(r"^\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}$")


class ApiError(Exception):
    """The MA's HTTP API cannot be reached or answered badly (the message says how)."""


def default_ma() -> str:
    return os.environ.get("GRIDRPC_MA_HTTP") or DEFAULT_HTTP


def resolve(ma: str | None) -> str:
    """The base URL (no trailing slash) of the MA's HTTP API."""
    ma = (ma or default_ma()).strip()
    if ma.startswith(("http://", "https://")):
        return ma.rstrip("/")
    if ma.startswith(("tcp://", "ipc://", "inproc://")):
        return _from_zmq(ma)
    if _HOSTPORT.match(ma):
        return "http://" + ma
    raise ApiError(f"--ma {ma!r}: give the MA's HTTP API as http://HOST:PORT or HOST:PORT "
                   "(the port of 'gridrpc ma --http-port')")


def _from_zmq(address: str) -> str:
    try:
        import gridrpc
        with gridrpc.Client(address, discovery_timeout=3, timeout=3) as c:
            tree = c.tree()
    except Exception as exc:  # noqa: BLE001 - any failure: one clear message
        raise ApiError(f"--ma {address}: cannot ask the MA for its HTTP address ({exc}); "
                       "give its HTTP API instead, e.g. --ma http://HOST:8080") from None
    for e in tree:
        if e.get("kind") == "ma" and isinstance(e.get("http"), str):
            url = e["http"].rstrip("/")
            host = urllib.parse.urlsplit(address).hostname or "127.0.0.1"
            return re.sub(r"//(0\.0\.0\.0|\[::\])", "//" + host, url)
    raise ApiError(f"--ma {address}: this MA publishes no HTTP API (start it with --http-port) "
                   "or is too old to say where; give it as --ma http://HOST:PORT")


def get_json(base: str, path: str, timeout: float = 5.0) -> Any:
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise ApiError(f"{base}{path}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ApiError(f"{base}{path}: {reason}") from None


def sse(base: str, path: str, *, last_id: str | None = None,
        timeout: float = 60.0) -> Iterator[tuple[str, str, str | None]]:
    """Server-Sent Events from ``base+path``: yields ``(event, data, id)``
    (``event`` is ``"message"`` unless named). Ends when the server closes."""
    req = urllib.request.Request(base + path, headers={"Accept": "text/event-stream"})
    if last_id:
        req.add_header("Last-Event-ID", last_id)
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise ApiError(f"{base}{path}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ApiError(f"{base}{path}: {getattr(exc, 'reason', exc)}") from None
    with resp:
        event, data, eid = "message", [], None
        for raw in resp:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not line:
                if data:
                    yield event, "\n".join(data), eid
                event, data = "message", []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
            elif field == "id":
                eid = value
