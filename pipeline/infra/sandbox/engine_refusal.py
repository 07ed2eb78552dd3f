"""What the engine proxy answers instead of forwarding: the refusals its checks raise."""

from __future__ import annotations


class Refused(Exception):
    """A request the proxy will not forward (its message goes back to the client)."""

    status = 403


class NotFound(Refused):
    """The addressed container or exec does not exist (the engine's 404, passed on)."""

    status = 404

