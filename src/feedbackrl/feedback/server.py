"""The labelling app served by uvicorn on loopback: in a background thread for in-process use (the
online loop, tests), or in a child process that can be killed and restarted on the same port
(the no-loss test and the load benchmark). `feedbackrl label serve` is the standalone server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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


# The child of ServerProcess: serve the app on the listening socket it inherits (fd in argv[1]).
_CHILD = """
import os, socket, sys
import uvicorn
from feedbackrl.feedback.app import create_app
sock = socket.socket(fileno=int(sys.argv[1]))
app = create_app(os.environ["FEEDBACKRL_DB"])
uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)).run(sockets=[sock])
"""


class ServerProcess:
    """The app served by uvicorn in a child process on a loopback socket this process holds.

    The socket outlives the child, so `restart()` (SIGKILL, then a fresh child) keeps the port:
    connections made while no child runs wait in the listen backlog, and only requests in flight
    in the killed child fail. `db` goes to the child in $FEEDBACKRL_DB (not argv, which `ps` shows);
    the pool size follows $FEEDBACKRL_DB_CONNECTIONS as for `feedbackrl label serve`.
    """

    def __init__(self, db: str, env: dict[str, str] | None = None) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(2048)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.env = {**os.environ, **(env or {}), "FEEDBACKRL_DB": db}
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        fd = self.sock.fileno()
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(fd)], pass_fds=[fd], env=self.env)

    def wait_ready(self, timeout_s: float = 60) -> None:
        """Block until the child answers HTTP (any status), or raise naming how it ended."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"the labelling server exited with status {code} before answering")
            try:
                httpx.get(f"{self.url}/api/me", timeout=1)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the labelling server did not answer within {timeout_s:.0f} s") from None

    def kill(self) -> None:
        """SIGKILL the child: no graceful shutdown, in-flight requests are cut."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.start()

    def __enter__(self) -> ServerProcess:
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self.sock.close()
