"""The route handlers of the HTTP API, one module per family of routes."""
