"""ZeroMQ transport: channels on asyncio, address helpers, error translation."""
from .channel import Channel, bind_router, connect_dealer, context, format_tcp, host_of  # noqa: F401
