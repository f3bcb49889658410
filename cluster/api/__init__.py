"""The HTTP API: the aiohttp application, validation, auth, metrics, the console and OpenAPI."""
