"""Clients: :class:`AsyncClient` (asyncio) and :class:`Client` (blocking, any thread)."""
from .aio import AsyncClient, AsyncHandle  # noqa: F401
from .call import Call, ServerInfo, wait  # noqa: F401
from .sync import Client, Handle  # noqa: F401
