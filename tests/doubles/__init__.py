"""Test doubles that run for real (HTTP servers on 127.0.0.1), shared by tests and the local demo."""
