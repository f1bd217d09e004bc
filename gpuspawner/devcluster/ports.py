"""Free loopback ports for the dev tools' servers and the tests' (the one place that picks them)."""

from __future__ import annotations

import socket
from collections.abc import Iterable


def free_port() -> int:
    """A loopback port nothing listens on now (the OS's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(names: Iterable[str]) -> dict[str, int]:
    """Distinct free loopback ports, one per name (all sockets held open while choosing)."""
    names = list(names)
    sockets = []
    try:
        for _ in names:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return {name: sock.getsockname()[1] for name, sock in zip(names, sockets, strict=True)}
    finally:
        for sock in sockets:
            sock.close()
