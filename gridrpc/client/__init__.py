"""Clients: :class:`AsyncClient` (asyncio) and :class:`Client` (blocking, any thread),
both configured by one :class:`ClientOptions`."""
from .aio import AsyncClient, AsyncHandle
from .futures import Call, ServerInfo, wait
from .options import ClientOptions
from .sync import Client, Handle

__all__ = ["AsyncClient", "AsyncHandle", "Call", "Client", "ClientOptions", "Handle", "ServerInfo", "wait"]
