"""``gridrpc events``: follow the MA's live events in a terminal.

Reads ``/api/events`` (Server-Sent Events) of the MA's HTTP API and prints
one line per event, or the events' JSON with ``--json`` (one object per line,
for ``jq``). ``--id REQUEST_ID`` shows one call's story so far and follows it
until it ends. Reconnects by itself (``Last-Event-ID``: nothing is missed
that the MA still remembers).

``--ma`` is the MA's HTTP API: ``http://HOST:PORT`` or ``HOST:PORT``
(``gridrpc ma --http-port PORT``); default ``$GRIDRPC_MA_HTTP`` or
http://127.0.0.1:8080. A ``tcp://`` address works when the MA publishes its
HTTP URL.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
from typing import Callable

from .httpclient import ApiError, default_ma, get_json, resolve, sse

#: call events after which a followed call is over
_FINAL = {"call_finished", "call_failed", "call_cancelled", "call_killed", "call_preempted",
          "discovery_failed"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("events", help="follow the live events of a tree (the MA's /api/events)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ma", default=None, metavar="URL",
                   help=f"the MA's HTTP API, http://HOST:PORT or HOST:PORT (default $GRIDRPC_MA_HTTP or {default_ma()})")
    p.add_argument("--id", metavar="REQUEST_ID", help="only this call: its story so far, then until it ends")
    p.add_argument("--kinds", metavar="KIND,...", help="only these kinds, e.g. call_failed,worker_died,dropped")
    p.add_argument("--replay", type=int, default=20, metavar="N", help="first show the last N events (default 20)")
    p.add_argument("--count", type=int, default=None, metavar="N", help="exit after N events")
    p.add_argument("--no-follow", action="store_true",
                   help="print what the MA remembers (with --id: the call's story) and exit")
    p.add_argument("--json", action="store_true", help="print each event as one JSON line")
    p.set_defaults(func=run)
    return p


def _clean(v) -> str:
    return _CONTROL.sub("?", str(v))


def format_event(ev: dict) -> str:
    t = ev.get("time")
    ts = (time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"
          if isinstance(t, (int, float)) else "?")
    parts = [ts, f"{_clean(ev.get('kind', '?')):<18}", f"{_clean(ev.get('element', '?')):<12}"]
    if ev.get("service"):
        parts.append(_clean(ev["service"]))
    if ev.get("user"):
        parts.append("user=" + _clean(ev["user"]))
    if ev.get("server") and ev.get("server") != ev.get("element"):
        parts.append("server=" + _clean(ev["server"]))
    d = ev.get("duration")
    if isinstance(d, (int, float)):
        parts.append(f"{d * 1000:.1f}ms" if d < 1 else f"{d:.2f}s")
    if ev.get("optional"):
        parts.append("optional")
    if ev.get("id"):
        parts.append("id=" + _clean(ev["id"]))
    if ev.get("detail"):
        parts.append("— " + _clean(ev["detail"]))
    return " ".join(parts)


def run(a: argparse.Namespace, out: Callable[[str], None] | None = None) -> int:
    out = out or (lambda s: print(s, flush=True))
    err = lambda s: print(f"gridrpc events: {s}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        base = resolve(a.ma)
    except ApiError as exc:
        err(str(exc))
        return 2
    show = (lambda ev: out(json.dumps(ev, sort_keys=True))) if a.json else (lambda ev: out(format_event(ev)))
    if a.no_follow:
        return _once(a, base, show, err)
    q = {}
    if a.id:
        q["id"] = a.id
    elif a.replay:
        q["replay"] = str(max(0, a.replay))
    if a.kinds:
        q["kinds"] = a.kinds
    path = "/api/events" + ("?" + urllib.parse.urlencode(q) if q else "")
    seen, last_id, failures = 0, None, 0
    try:
        while True:
            try:
                for event, data, eid in sse(base, path, last_id=last_id):
                    failures = 0
                    if eid:
                        last_id = eid
                    if event == "dropped":
                        err(f"{_dropped(data)} events dropped (this reader was too slow)")
                        continue
                    if event == "gap":
                        err("some events were missed while disconnected")
                        continue
                    try:
                        ev = json.loads(data)
                    except ValueError:
                        continue
                    show(ev)
                    seen += 1
                    if a.count is not None and seen >= a.count:
                        return 0
                    if a.id and ev.get("kind") in _FINAL:
                        return 0
                err("the MA closed the stream; reconnecting")
            except ApiError as exc:
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    err(f"{exc}; retrying")
                if last_id is None and seen == 0 and failures >= 3 and a.count is not None:
                    return 1
            time.sleep(1.0)
    except KeyboardInterrupt:
        return 0


def _dropped(data: str) -> str:
    try:
        return str(int(json.loads(data).get("dropped", 0)))
    except (ValueError, AttributeError, TypeError):
        return "some"


def _once(a: argparse.Namespace, base: str, show, err) -> int:
    try:
        if a.id:
            data = get_json(base, "/api/events/" + urllib.parse.quote(a.id, safe=""))
            events = data.get("events", [])
        else:
            q = {"replay": str(max(0, a.replay)), "follow": "0"}
            if a.kinds:
                q["kinds"] = a.kinds
            events = [json.loads(data) for event, data, _ in
                      sse(base, "/api/events?" + urllib.parse.urlencode(q), timeout=10.0)
                      if event == "message"]
    except ApiError as exc:
        if a.id and "HTTP 404" in str(exc):
            err(f"no events for request id {a.id!r} (unknown, or forgotten)")
        else:
            err(str(exc))
        return 1
    for ev in events:
        show(ev)
    return 0
