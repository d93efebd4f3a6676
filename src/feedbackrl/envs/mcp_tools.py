"""Tools served over MCP (the `mcp` SDK, `agents` extra): users bring their own tool servers.

`McpTools(command, args)` starts an MCP server as a subprocess over stdio, keeps one client
session open on a background event loop, and exposes the server's tools as plain `Tool`
callables (argument text -> result text) for a `Toolbox`. In the minimal tool-call format the
argument text goes to the tool's first required parameter; a tool without parameters gets none.
A tool result flagged as an error, a protocol error or a call past `timeout_s` raises, which the
`Toolbox` turns into an ``error: ...`` observation. `close()` ends the session and the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

from feedbackrl.envs.tools import Tool


class McpTools:
    """One MCP server's tools, callable from any thread."""

    def __init__(self, command: str, args: Sequence[str] = (), env: dict[str, str] | None = None,
                 timeout_s: float = 10.0) -> None:
        try:
            from mcp import ClientSession, StdioServerParameters
            from mcp.client.stdio import stdio_client
        except ImportError as e:
            raise ImportError("MCP tools need the mcp SDK: pip install 'feedbackrl[agents]'") from e
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="feedbackrl-mcp", daemon=True)
        self._thread.start()
        self._started: concurrent.futures.Future[Any] = concurrent.futures.Future()
        params = StdioServerParameters(command=command, args=list(args), env=env)
        self._closing: asyncio.Event | None = None
        self._task = asyncio.run_coroutine_threadsafe(self._serve(params, ClientSession, stdio_client), self._loop)
        self._session, listed = self._started.result(timeout=timeout_s)
        # mcp 2.x names fields in snake case (input_schema), 1.x in camel case (inputSchema)
        self.schemas = {t.name: getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {}
                        for t in listed}

    async def _serve(self, params: Any, session_cls: Any, stdio_client: Any) -> None:
        """The session's whole life in one task (anyio cancel scopes must be left in the task that entered them)."""
        self._closing = asyncio.Event()
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(stdio_client(params))
                session = await stack.enter_async_context(session_cls(read, write))
                await session.initialize()
                self._started.set_result((session, (await session.list_tools()).tools))
                await self._closing.wait()
        except BaseException as e:
            if not self._started.done():
                self._started.set_exception(e)
            raise

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=self.timeout_s)

    def call(self, name: str, argument: str) -> str:
        """Call tool `name` with `argument` as its first required parameter; the text of its result."""
        schema = self.schemas.get(name)
        if schema is None:
            raise KeyError(f"unknown MCP tool {name}")
        required = schema.get("required") or list(schema.get("properties") or {})
        arguments = {required[0]: argument} if required else {}
        result = self._run(self._session.call_tool(name, arguments))
        text = " ".join(getattr(c, "text", "") for c in getattr(result, "content", []) or [])
        if getattr(result, "isError", False) or getattr(result, "is_error", False):
            raise RuntimeError(text[:200] or "the tool reported an error")
        return text

    def tools(self) -> dict[str, Tool]:
        """{name: callable} for a `Toolbox`."""
        return {name: (lambda arg, _n=name: self.call(_n, arg)) for name in self.schemas}

    def close(self) -> None:
        """End the session (the server process exits with it) and the background loop."""
        if self._closing is not None:
            self._loop.call_soon_threadsafe(self._closing.set)
        try:
            self._task.result(timeout=self.timeout_s)
        except Exception:  # noqa: BLE001 - a server that died or would not stop: the loop goes anyway
            pass
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
