"""The dashboard's HTTP side, mounted on the MA's aiohttp application.

``add_dashboard_routes(app, tree_source=agent.tree, ...)`` adds:

* ``/`` — the live dashboard (``static/index.html``, with a plain table of
  the tree inside ``<noscript>``), ``/static/*`` its files (no CDN, no build);
* ``/api/events`` (SSE) and ``/api/events/{id}`` (one call's story), see
  :mod:`gridrpc.dashboard.stream`;
* ``/api/stats`` — the event log's aggregates plus the stream's counters;
* ``/metrics`` — Prometheus text from :mod:`gridrpc.dashboard.metrics`;
* ``/api/tree`` — only when the application does not serve it already.

It must be called before the application starts (aiohttp freezes the router).
"""
from __future__ import annotations

import html
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson
from aiohttp import web

from ..core.events import EventLog
from .metrics import CONTENT_TYPE_LATEST, GridCollector, make_registry, render
from .stream import EventHub, JsonlWriter, sse_handler, story_handler

STATIC = Path(__file__).resolve().parent / "static"

#: the page loads only its own files: no inline script, no third-party origin
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


def _dumps(obj) -> str:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


@dataclass
class Dashboard:
    """What :func:`add_dashboard_routes` mounted; ``hub.emit`` is the MA's event sink."""
    hub: EventHub
    log: EventLog
    collector: GridCollector
    registry: object
    tree_source: Callable[[], list[dict]]
    name: str


def add_dashboard_routes(app: web.Application, *, tree_source: Callable[[], list[dict]],
                         event_log: EventLog | None = None, hub: EventHub | None = None,
                         statistics: Callable[[], dict] | None = None,
                         services: Callable[[], dict] | None = None, name: str = "MA",
                         events_file: str | None = None, events_file_max_bytes: int = 64 << 20,
                         clock: Callable[[], float] = time.time) -> Dashboard:
    """Mount the dashboard, the event API and ``/metrics`` on ``app``.

    ``tree_source()`` returns the ``/api/tree`` element list (the MA's
    ``agent.tree``); ``statistics`` and ``services`` are the MA's
    ``agent.statistics`` and ``agent.registry.catalogue`` (for ``/metrics``).
    Give ``hub`` (or ``event_log``) to share them with the runtime; by
    default a new :class:`EventHub` is made. ``events_file``: also write every
    event there as JSON lines (rotated past ``events_file_max_bytes``).
    """
    if hub is None:
        writer = JsonlWriter(events_file, max_bytes=events_file_max_bytes) if events_file else None
        hub = EventHub(event_log, clock=clock, writer=writer)
    log = hub.log
    collector = GridCollector(tree_source=tree_source, statistics=statistics, services=services,
                              event_log=log, hub=hub, clock=clock)
    registry = make_registry(collector)
    dash = Dashboard(hub=hub, log=log, collector=collector, registry=registry,
                     tree_source=tree_source, name=name)
    page = (STATIC / "index.html").read_text(encoding="utf-8")

    async def index(request: web.Request) -> web.Response:
        body = page.replace("<!--TITLE-->", html.escape(name)).replace(
            "<!--NOSCRIPT-->", _noscript_table(tree_source()))
        return web.Response(text=body, content_type="text/html", headers=_page_headers())

    async def events(request: web.Request) -> web.StreamResponse:
        return await sse_handler(request, hub)

    async def story(request: web.Request) -> web.Response:
        return await story_handler(request, hub)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({**log.stats(clock()), "stream": hub.statistics()}, dumps=_dumps,
                                 headers={"Cache-Control": "no-store"})

    async def metrics(request: web.Request) -> web.Response:
        resp = web.Response(body=render(registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def tree(request: web.Request) -> web.Response:
        return web.json_response({"elements": tree_source()}, dumps=_dumps)

    existing = {r.canonical for r in app.router.resources()}
    routes = [web.get("/", index), web.get("/api/events", events), web.get("/api/events/{id}", story),
              web.get("/api/stats", stats), web.get("/metrics", metrics)]
    if "/api/tree" not in existing:
        routes.append(web.get("/api/tree", tree))
    app.add_routes(routes)
    app.router.add_static("/static/", STATIC, append_version=False)
    app.on_startup.append(_start_writer(hub))
    app.on_shutdown.append(hub.aclose)      # ends open streams before aiohttp waits for handlers
    app.on_response_prepare.append(_static_headers)
    return dash


def _start_writer(hub: EventHub):
    async def start(app: web.Application) -> None:
        if hub.writer is not None and getattr(hub.writer, "_task", None) is None:
            hub.writer.start()
    return start


def _page_headers() -> dict[str, str]:
    return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


async def _static_headers(request: web.Request, response: web.StreamResponse) -> None:
    if request.path.startswith("/static/"):
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Cache-Control", "no-cache")


def _noscript_table(elements: list[dict]) -> str:
    """The tree as a plain table for browsers without JavaScript (escaped)."""
    ma = next((e for e in elements if e.get("kind") == "ma"), None)
    ref = ma.get("last_heartbeat") if ma else None
    ref = ref if isinstance(ref, (int, float)) else time.time()
    rows = []
    for e in elements:
        if e.get("kind") == "ma":
            hb = "root"
        else:
            t = e.get("last_heartbeat")
            hb = f"{max(0.0, ref - t):.1f}s ago" if isinstance(t, (int, float)) else "?"
        load = e.get("load") or {}
        cells = (e.get("name"), e.get("kind"), e.get("parent") or "", e.get("address"), e.get("pid"),
                 ", ".join(str(s) for s in (e.get("services") or [])), e.get("state"), hb,
                 load.get("num_running", ""), load.get("num_waiting", ""))
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c if c is not None else ''))}</td>"
                                     for c in cells) + "</tr>")
    return ("<table><tr><th>name</th><th>kind</th><th>parent</th><th>address</th><th>pid</th>"
            "<th>services</th><th>state</th><th>heartbeat</th><th>running</th><th>waiting</th></tr>"
            + "".join(rows) + "</table>")
