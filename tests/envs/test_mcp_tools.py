"""Tools over MCP: a server written with the mcp SDK, started over stdio, its tools called
through a Toolbox; an error result, an unknown tool and a hanging tool are observations."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp.server.mcpserver")

from feedbackrl.envs.mcp_tools import McpTools  # noqa: E402
from feedbackrl.envs.tools import Toolbox, ToolCall, parse_tool_call  # noqa: E402

SERVER = '''
import time
from mcp.server.mcpserver import MCPServer

server = MCPServer("test-tools")

@server.tool()
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()

@server.tool()
def divide(expression: str) -> str:
    """a/b for 'a/b'."""
    a, b = expression.split("/")
    return str(int(a) // int(b))

@server.tool()
def nap(seconds: str) -> str:
    time.sleep(float(seconds))
    return "awake"

server.run("stdio")
'''


@pytest.fixture(scope="module")
def mcp_tools(tmp_path_factory: pytest.TempPathFactory):
    script = tmp_path_factory.mktemp("mcp") / "server.py"
    script.write_text(SERVER)
    tools = McpTools(sys.executable, [str(script)], timeout_s=20.0)
    yield tools
    tools.close()


def test_lists_and_calls_the_servers_tools(mcp_tools: McpTools) -> None:
    assert set(mcp_tools.schemas) == {"shout", "divide", "nap"}
    box = Toolbox(mcp_tools.tools(), timeout_s=20.0)
    call = parse_tool_call("shout(hello there)")
    assert isinstance(call, ToolCall) and box.call(call).content == "HELLO THERE"
    assert box.call(ToolCall("divide", "84/2")).content == "42"


def test_failures_are_observations(mcp_tools: McpTools) -> None:
    box = Toolbox(mcp_tools.tools(), timeout_s=20.0)
    bad = box.call(ToolCall("divide", "1/0"))
    assert not bad.ok and bad.content == "error: divide failed: RuntimeError: Error executing tool divide"
    assert box.call(ToolCall("search", "x")).content == "error: unknown tool search; tools: divide, nap, shout"
    with pytest.raises(KeyError, match="unknown MCP tool"):
        mcp_tools.call("missing", "")


def test_a_hanging_tool_times_out_and_close_still_ends_the_server(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    tools = McpTools(sys.executable, [str(script)], timeout_s=20.0)
    assert tools.call("shout", "a") == "A"
    slow = Toolbox(tools.tools(), timeout_s=0.5).call(ToolCall("nap", "600"))
    assert not slow.ok and slow.content == "error: nap timed out after 0.5s"
    tools.close()
    assert not tools._thread.is_alive()
