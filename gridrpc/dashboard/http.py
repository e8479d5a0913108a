"""HTTP status API on the MA: ``/api/tree``, ``/api/services``, ``/metrics``,
``/healthz`` and ``/`` (a plain page listing the tree). Started with aiohttp's
``AppRunner``/``TCPSite`` on the MA's own event loop."""
from __future__ import annotations

import html
import time

from aiohttp import web


class StatusServer:
    def __init__(self, agent, *, host: str = "127.0.0.1", port: int = 8080) -> None:
        self.agent = agent
        self.host = host
        self.port = port
        self.runner: web.AppRunner | None = None
        app = web.Application()
        app.add_routes([web.get("/api/tree", self.api_tree), web.get("/api/services", self.api_services),
                        web.get("/metrics", self.metrics), web.get("/healthz", self.healthz),
                        web.get("/", self.index)])
        self.app = app

    async def start(self) -> None:
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        if self.port == 0:
            self.port = site._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        if self.runner:
            await self.runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def api_tree(self, request: web.Request) -> web.Response:
        return web.json_response({"elements": self.agent.tree()})

    async def api_services(self, request: web.Request) -> web.Response:
        return web.json_response({"services": self.agent.registry.catalogue()})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "name": self.agent.name,
                                  "children": len(self.agent.registry.children)})

    async def metrics(self, request: web.Request) -> web.Response:
        tree = self.agent.tree()
        st = self.agent.statistics()
        lines = [
            "# HELP gridrpc_elements Elements in the tree by kind.", "# TYPE gridrpc_elements gauge"]
        kinds: dict[str, int] = {}
        for e in tree:
            kinds[e.get("kind", "?")] = kinds.get(e.get("kind", "?"), 0) + 1
        lines += [f'gridrpc_elements{{kind="{k}"}} {v}' for k, v in sorted(kinds.items())]
        lines += ["# HELP gridrpc_services Services offered in the tree.", "# TYPE gridrpc_services gauge",
                  f"gridrpc_services {len(self.agent.registry.catalogue())}",
                  "# HELP gridrpc_discoveries_total Discovery requests handled by the MA.",
                  "# TYPE gridrpc_discoveries_total counter",
                  f"gridrpc_discoveries_total {st['discoveries']}",
                  "# TYPE gridrpc_discoveries_timed_out_total counter",
                  f"gridrpc_discoveries_timed_out_total {st['discoveries_timed_out']}",
                  "# TYPE gridrpc_bad_messages_total counter",
                  f"gridrpc_bad_messages_total {st['bad_messages']}",
                  "# HELP gridrpc_sed_running Calls running per SeD.", "# TYPE gridrpc_sed_running gauge"]
        for e in tree:
            if e.get("kind") == "sed":
                load = e.get("load") or {}
                lines.append(f'gridrpc_sed_running{{sed="{e["name"]}"}} {load.get("num_running", 0)}')
                lines.append(f'gridrpc_sed_waiting{{sed="{e["name"]}"}} {load.get("num_waiting", 0)}')
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def index(self, request: web.Request) -> web.Response:
        rows = []
        now = time.time()
        for e in self.agent.tree():
            age = now - float(e.get("last_heartbeat") or now)
            rows.append("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in (
                e["name"], e.get("kind"), e.get("parent") or "", e.get("address"), e.get("pid"),
                ", ".join(e.get("services") or []), e.get("state"), f"{age:.1f}s ago")) + "</tr>")
        body = (f"<!doctype html><html><head><title>gridrpc: {html.escape(self.agent.name)}</title>"
                "<meta http-equiv='refresh' content='2'></head><body>"
                f"<h1>gridrpc tree — {html.escape(self.agent.name)}</h1><table border=1 cellpadding=4>"
                "<tr><th>name</th><th>kind</th><th>parent</th><th>address</th><th>pid</th>"
                "<th>services</th><th>state</th><th>heartbeat</th></tr>"
                + "".join(rows) + "</table><p><a href='/api/tree'>/api/tree</a> · "
                "<a href='/api/services'>/api/services</a> · <a href='/metrics'>/metrics</a></p></body></html>")
        return web.Response(text=body, content_type="text/html")
