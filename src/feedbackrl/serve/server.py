"""`feedbackrl serve`: a policy behind the OpenAI-compatible endpoint of `openai_api.py`, served by uvicorn.

The socket is bound (and listening) before the model is loaded, so a port in use fails at once with a
`ServeError` naming it; connections that arrive while the model loads wait in the socket's backlog. The
default interface is loopback: the endpoint has no authentication, and a policy served on the network
answers anyone who reaches it.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ServeError(ValueError):
    """The server cannot start as asked (a port in use, an interface that does not exist)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one (`sock.getsockname()[1]`)."""
    if not 0 <= port <= 65535:
        raise ServeError(f"--port {port}: a TCP port is 0-65535 (0 = any free port)")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as e:
        raise ServeError(f"--host {host!r}: not an address or a name this machine resolves ({e.strerror})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free; one listened on is not
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} on {host} is in use (another server is listening there); pick another "
                             "with --port, or --port 0 for any free one") from None
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(app: Any, sock: socket.socket) -> None:
    """Serve `app` on `sock` until interrupted (Ctrl-C)."""
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
