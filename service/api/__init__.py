"""The REST API: ``app.create_app``; one module per resource in ``routers/``."""
