"""The labelling app served by uvicorn in a background thread, on loopback, for in-process use
(the online loop, tests). `feedbackrl label serve` is the standalone server."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

START_TIMEOUT_S = 20


class LiveServer:
    """uvicorn serving `app` on 127.0.0.1 at an ephemeral port; `url` is its base URL.

    Use as a context manager: entering starts it (or raises after 20 s), leaving stops it."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"uvicorn did not start within {START_TIMEOUT_S} s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
