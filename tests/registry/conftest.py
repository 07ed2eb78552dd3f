"""Fixtures of the registry-auth tests: see helpers.py."""

from tests.registry.helpers import _token_server_defaults, docker_login, htpasswd_registry, token_registry

__all__ = ["_token_server_defaults", "docker_login", "htpasswd_registry", "token_registry"]
