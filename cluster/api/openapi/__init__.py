"""The OpenAPI 3.1 description of the HTTP API (``GET /openapi.json``) and its Markdown."""
