"""``gridrpc top``: the dashboard at a glance in a terminal.

Polls the MA's HTTP API (``/api/tree`` and ``/api/stats``) every second and
shows the tree with each element's state and load, calls per second and
latency per service, users, and the latest errors. ``--once`` prints one
frame and exits (scripts, tests). Ctrl-C quits.

``--ma`` is the MA's HTTP API: ``http://HOST:PORT`` or ``HOST:PORT``
(``gridrpc ma --http-port PORT``); default ``$GRIDRPC_MA_HTTP`` or
http://127.0.0.1:8080. A ``tcp://`` address works when the MA publishes its
HTTP URL.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from .httpclient import ApiError, default_ma, get_json, resolve

if TYPE_CHECKING:  # pragma: no cover - rich is imported by the functions that draw, not by `gridrpc --help`
    from rich.console import Console, Group
    from rich.text import Text


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("top", help="live view of a tree in the terminal (the MA's HTTP API)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ma", default=None, metavar="URL",
                   help=f"the MA's HTTP API, http://HOST:PORT or HOST:PORT (default $GRIDRPC_MA_HTTP or {default_ma()})")
    p.add_argument("--interval", type=float, default=1.0, help="refresh period, s (default 1)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--width", type=int, default=None, help="force the width (default: the terminal's)")
    p.set_defaults(func=run)
    return p


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _secs(v: Any) -> str:
    v = _num(v)
    if v is None:
        return "–"
    if v < 0.001:
        return f"{v * 1e6:.0f}µs"
    if v < 1:
        return f"{v * 1000:.1f}ms" if v < 0.1 else f"{v * 1000:.0f}ms"
    if v < 120:
        return f"{v:.2f}s" if v < 10 else f"{v:.1f}s"
    return f"{v / 60:.1f}m"


def _rate(v: Any) -> str:
    v = _num(v)
    if v is None:
        return "–"
    return "0" if v == 0 else f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _age(v: float | None) -> str:
    if v is None:
        return "?"
    v = max(0.0, v)                      # two hosts' clocks: never "-0.0s"
    return f"{v:.1f}s" if v < 60 else f"{v / 60:.0f}m" if v < 3600 else f"{v / 3600:.1f}h"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def T(value: Any, style: str = "") -> Text:
    """A cell as plain text: names and messages are never read as rich markup."""
    from rich.text import Text
    return Text(_CONTROL.sub("?", "" if value is None else str(value)), style=style)


def _ordered(elements: list[dict]) -> list[tuple[dict, str]]:
    """Depth-first order with tree guides: (element, prefix)."""
    names = {e.get("name") for e in elements}
    kids: dict[Any, list[dict]] = {}
    roots = []
    for e in elements:
        p = e.get("parent")
        if p in names and p != e.get("name"):
            kids.setdefault(p, []).append(e)
        else:
            roots.append(e)
    rank = {"ma": 0, "la": 1, "sed": 2}
    key = lambda e: (rank.get(e.get("kind"), 3), str(e.get("name")))  # noqa: E731
    out: list[tuple[dict, str]] = []
    seen: set = set()

    def walk(e: dict, prefix: str, last: bool, depth: int) -> None:
        if e.get("name") in seen:
            return
        seen.add(e.get("name"))
        out.append((e, prefix + ("" if depth == 0 else "└─ " if last else "├─ ")))
        children = sorted(kids.get(e.get("name"), []), key=key)
        for i, c in enumerate(children):
            walk(c, prefix + ("" if depth == 0 else "   " if last else "│  "), i == len(children) - 1, depth + 1)

    for r in sorted(roots, key=key):
        walk(r, "", True, 0)
    return out


def render(tree: list[dict], stats: dict | None, *, url: str, error: str | None = None) -> Group:
    """One frame (pure: the data in, rich renderables out)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text
    stats = stats or {}
    ma = next((e for e in tree if e.get("kind") == "ma"), None)
    ref = _num(ma.get("last_heartbeat")) if ma else None
    ref = ref if ref is not None else _num(stats.get("now")) or time.time()
    seds = [e for e in tree if e.get("kind") == "sed"]
    running = sum(_num((e.get("load") or {}).get("num_running")) or 0 for e in seds)
    waiting = sum(_num((e.get("load") or {}).get("num_waiting")) or 0 for e in seds)
    services = {s for e in seds for s in (e.get("services") or [])}
    head = Text()
    head.append("gridrpc top ", style="bold cyan")
    head.append_text(T(ma.get("name") if ma else "?", "bold"))
    head.append_text(T(f"  {url}", "dim"))
    head.append("\n")
    for label, value in (("elements", len(tree)), ("services", len(services)),
                         ("calls/s", _rate(stats.get("calls_per_s"))), ("running", int(running)),
                         ("waiting", int(waiting)), ("events/s", _rate(stats.get("events_per_s"))),
                         ("unfairness", f"{stats['unfairness']:.2f}" if _num(stats.get("unfairness")) is not None else "–")):
        head.append(f"{label} ", style="dim")
        head.append(f"{value}   ", style="bold")
    if error:
        head.append("\n")
        head.append_text(T(error, "bold red"))

    t = Table(title="tree", title_justify="left", expand=True, box=None, pad_edge=False, header_style="dim")
    for col, j in (("element", "left"), ("kind", "left"), ("state", "left"), ("heartbeat", "right"),
                   ("running", "right"), ("waiting", "right"), ("free cpu", "right"), ("queue", "left"),
                   ("done", "right")):
        t.add_column(col, justify=j, no_wrap=True)
    for e, prefix in _ordered(tree):
        load = e.get("load") or {}
        lost = e.get("state") == "lost"
        if e.get("kind") == "ma":
            up = ref - _num(e["started"]) if _num(e.get("started")) is not None else None
            hb = "root" + (f", up {_age(up)}" if up is not None else "")
        else:
            hb = _age(ref - _num(e["last_heartbeat"])) if _num(e.get("last_heartbeat")) is not None else "?"
        cpu = _num(load.get("free_cpu"))
        is_sed = e.get("kind") == "sed"
        name = T(prefix, "dim")
        name.append_text(T(e.get("name"), "bold red" if lost else "bold"))
        t.add_row(name, T(e.get("kind")), T(e.get("state", "alive"), "red" if lost else "green"),
                  T(hb), T(load.get("num_running", "")) if is_sed else T(""),
                  T(load.get("num_waiting", "")) if is_sed else T(""),
                  T((f"{cpu * 100:.0f}%" if cpu <= 1 else f"{cpu:.0f}%") if cpu is not None else ""),
                  T(load.get("policy") or load.get("queue") or "") if is_sed else
                  T(f"{load['children']} children" if "children" in load else ""),
                  T(load.get("completed", "")) if is_sed else T(""))

    s = Table(title="services", title_justify="left", expand=True, box=None, pad_edge=False, header_style="dim")
    for col in ("service", "calls/s", "mean", "p95", "wait", "errors", "total"):
        s.add_column(col, justify="left" if col == "service" else "right", no_wrap=True)
    for name, v in sorted((stats.get("services") or {}).items()):
        total = sum(x for x in (v.get("total") or {}).values() if isinstance(x, int))
        s.add_row(T(name, "bold"), T(_rate(v.get("calls_per_s"))), T(_secs(v.get("mean"))),
                  T(_secs(v.get("p95"))), T(_secs(v.get("wait_mean"))),
                  T(v.get("errors", 0), "red" if v.get("errors") else "dim"), T(total))

    u = Table(title="users", title_justify="left", expand=True, box=None, pad_edge=False, header_style="dim")
    for col in ("user", "queued", "done", "failed", "killed", "optional ✓/✗", "server·s", "share"):
        u.add_column(col, justify="left" if col == "user" else "right", no_wrap=True)
    for name, v in sorted((stats.get("users") or {}).items()):
        sat = _num(v.get("satisfaction"))
        u.add_row(T(name, "bold"), T(v.get("queued", 0)), T(v.get("finished", 0)),
                  T(v.get("failed", 0)), T((v.get("killed") or 0) + (v.get("preempted") or 0)),
                  T(f"{v.get('optional_completed', 0)}/{v.get('optional_killed', 0)}"),
                  T(_secs(v.get("allocated"))), T(f"{sat:.2f}" if sat is not None else "–"))

    parts: list = [head, t, s]
    if stats.get("users"):
        parts.append(u)
    errors = (stats.get("errors") or [])[:5]
    if errors:
        et = Table(title="latest errors", title_justify="left", expand=True, box=None, pad_edge=False,
                   show_header=False)
        # the message gives way first: when, kind and element keep their width
        et.add_column("when", no_wrap=True, style="dim", min_width=8)
        et.add_column("kind", no_wrap=True, style="red",
                      min_width=min(24, max(len(str(ev.get("kind") or "")) for ev in errors)))
        et.add_column("element", no_wrap=True,
                      min_width=min(24, max(len(str(ev.get("element") or "")) for ev in errors)))
        et.add_column("what", overflow="ellipsis", no_wrap=True, ratio=1)
        for ev in errors:
            tm = _num(ev.get("time"))
            what = " ".join(str(x) for x in (ev.get("service"), ev.get("id"), ev.get("detail")) if x)
            et.add_row(T(time.strftime("%H:%M:%S", time.localtime(tm)) if tm else "?"), T(ev.get("kind")),
                       T(ev.get("element")), T(what))
        parts.append(et)
    return Group(*parts)


def fetch(base: str) -> tuple[list[dict], dict | None]:
    tree = get_json(base, "/api/tree").get("elements") or []
    try:
        stats = get_json(base, "/api/stats")
    except ApiError:
        stats = None                      # an MA without the event log: the tree alone
    return tree, stats


def run(a: argparse.Namespace, console: Console | None = None) -> int:
    if console is None:
        from rich.console import Console
        console = Console(width=a.width, highlight=False)
    try:
        base = resolve(a.ma)
    except ApiError as exc:
        print(f"gridrpc top: {exc}", file=sys.stderr)
        return 2
    if a.once:
        try:
            tree, stats = fetch(base)
        except ApiError as exc:
            print(f"gridrpc top: {exc}", file=sys.stderr)
            return 1
        console.print(render(tree, stats, url=base))
        return 0
    from rich.live import Live
    tree: list[dict] = []
    stats: dict | None = None
    try:
        with Live(render(tree, stats, url=base, error="connecting…"), console=console,
                  refresh_per_second=4, screen=False, transient=False) as live:
            while True:
                try:
                    tree, stats = fetch(base)
                    live.update(render(tree, stats, url=base))
                except ApiError as exc:
                    live.update(render(tree, stats, url=base, error=f"{exc} (retrying)"))
                time.sleep(max(0.2, a.interval))
    except KeyboardInterrupt:
        return 0
