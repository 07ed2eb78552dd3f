"""The api image's service: run status and results over HTTP (FastAPI)."""
