"""HTTP status API and human page of the Master Agent (aiohttp)."""
