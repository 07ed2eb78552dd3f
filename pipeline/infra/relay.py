"""Byte relays that give a network-less runner exactly one way out: the model endpoint.

The runner container keeps ``network_mode: none``. The worker (host side)
listens on a Unix socket in a private directory mounted into the runner and
connects each accepted stream to the ONE endpoint the policy names
(``UnixToTcpRelay``). Inside the runner, ``benchseal trial run`` listens on its
own loopback and forwards to that socket (``TcpToUnixRelay``), so the agent's
HTTP client talks to ``http://127.0.0.1:<port>``. Nothing else is reachable: no
registry, no host ports, no metadata address, no internet.

Trial containers get the same single way out when the agent is model-backed:
the engine proxy starts a gateway container per trial container (network
``none``, the relay socket mounted, ``python3 -m pipeline.infra.relay``) and
puts the trial container into the gateway's network namespace, so the model is
``http://127.0.0.1:GATEWAY_PORT`` there and there is no other interface.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

_BUF = 65536


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(_BUF)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _splice(a: socket.socket, b: socket.socket) -> None:
    t = threading.Thread(target=_pump, args=(b, a), daemon=True)
    t.start()
    _pump(a, b)
    t.join()
    for s in (a, b):
        with contextlib.suppress(OSError):
            s.close()


class _Relay:
    def __init__(self, listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
        self._listener = listener
        self._connect = connect
        self._stop = threading.Event()
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, name=type(self).__name__, daemon=True)

    def start(self) -> _Relay:
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                break
            self.connections += 1
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        try:
            upstream = self._connect()
        except OSError:
            client.close()
            return
        _splice(client, upstream)

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)


class UnixToTcpRelay(_Relay):
    """Host side: ``socket_path`` -> ``host:port`` (TLS to ``host`` when ``tls``)."""

    def __init__(self, socket_path: Path, host: str, port: int, *, tls: bool = False, timeout: float = 30.0) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(socket_path))
        # The runner connects as its own root; nobody else on the host needs to.
        os.chmod(socket_path, 0o600)
        listener.listen(64)
        context = ssl.create_default_context() if tls else None

        def connect() -> socket.socket:
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.settimeout(None)
            if context is not None:
                return context.wrap_socket(sock, server_hostname=host)
            return sock

        self.socket_path = socket_path
        super().__init__(listener, connect)


class TcpToUnixRelay(_Relay):
    """Runner (or trial gateway) side: ``127.0.0.1:<port>`` (ephemeral unless given) -> ``socket_path``."""

    def __init__(self, socket_path: Path, port: int = 0) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)

        def connect() -> socket.socket:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(socket_path))
            return sock

        self.port: int = listener.getsockname()[1]
        super().__init__(listener, connect)


GATEWAY_PORT = 47813  # the model's loopback port inside a trial container (gateway namespace)


def gateway_main(argv: Sequence[str]) -> int:
    """``python3 -m pipeline.infra.relay SOCKET [PORT]``: serve 127.0.0.1:PORT -> SOCKET until killed."""
    if not 1 <= len(argv) <= 2 or (len(argv) == 2 and not argv[1].isdigit()):
        print("usage: python3 -m pipeline.infra.relay SOCKET [PORT]", file=sys.stderr)
        return 2
    relay = TcpToUnixRelay(Path(argv[0]), int(argv[1]) if len(argv) == 2 else GATEWAY_PORT)
    relay.start()
    threading.Event().wait()
    return 0  # pragma: no cover - the gateway is removed with its trial container


if __name__ == "__main__":
    raise SystemExit(gateway_main(sys.argv[1:]))
