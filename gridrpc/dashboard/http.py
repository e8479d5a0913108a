"""HTTP status API on the MA, read-only: ``/api/tree``, ``/api/services``,
``/healthz``, plus the dashboard (``/``, ``/api/events``, ``/api/stats``,
``/metrics``; :mod:`gridrpc.dashboard.app`). Started with aiohttp's
``AppRunner``/``TCPSite`` on the MA's own event loop.

It binds loopback unless told otherwise; bound anywhere else it requires a
token (``--http-token-file``): ``Authorization: Bearer TOKEN``, or
``?token=TOKEN`` once in a browser (then a cookie). Every method but GET
(and HEAD) is refused."""
from __future__ import annotations

import hmac

from aiohttp import web

from ..errors import ConfigError
from ..transport.security import is_loopback
from .app import add_dashboard_routes

COOKIE = "gridrpc_token"


class StatusServer:
    def __init__(self, agent, *, host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
                 events_file: str | None = None) -> None:
        if not is_loopback(host) and not token:
            raise ConfigError(f"the HTTP API would listen on {host} without a token: anyone reaching the "
                              "port could read the tree and every call's story; give --http-token-file FILE "
                              "(or keep --http-host on loopback)")
        self.agent = agent
        self.host = host
        self.port = port
        self.token = token
        self.runner: web.AppRunner | None = None
        app = web.Application(middlewares=[self._guard])
        app.add_routes([web.get("/api/tree", self.api_tree), web.get("/api/services", self.api_services),
                        web.get("/healthz", self.healthz)])
        self.dashboard = add_dashboard_routes(
            app, tree_source=agent.tree, statistics=agent.statistics, services=agent.registry.catalogue,
            name=agent.name, hub=getattr(agent, "events", None), events_file=events_file)
        self.app = app

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET"])
        if self.token:
            given = request.headers.get("Authorization", "")
            given = given[7:] if given.startswith("Bearer ") else request.query.get("token") or \
                request.cookies.get(COOKIE, "")
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                raise web.HTTPUnauthorized(text="a token is required (Authorization: Bearer TOKEN)\n")
            response = await handler(request)
            if request.query.get("token"):         # a browser given ?token= once keeps it in a cookie
                response.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict")
            return response
        return await handler(request)

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
