"""`feedbackrl serve`: a real server process on loopback that the `openai` client talks to over HTTP, and a
port in use refused at once with a message naming it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from feedbackrl.cli import app  # noqa: E402
from feedbackrl.serve.server import ServeError, bind  # noqa: E402


def test_a_port_in_use_is_a_clear_error() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        res = CliRunner().invoke(app, ["serve", "tiny", "--port", str(port)])
        assert res.exit_code == 2
        assert f"error: port {port} on 127.0.0.1 is in use" in res.output and "--port 0" in res.output
    finally:
        taken.close()


@pytest.mark.parametrize(("host", "port", "message"), [
    ("127.0.0.1", 70000, "a TCP port is 0-65535"),
    ("no-such-host.invalid", 0, "not an address or a name this machine resolves"),
])
def test_bad_addresses(host: str, port: int, message: str) -> None:
    with pytest.raises(ServeError, match=message):
        bind(host, port)


def test_a_missing_model_is_a_clear_error(tmp_path) -> None:
    res = CliRunner().invoke(app, ["serve", str(tmp_path / "nowhere"), "--port", "0"])
    assert res.exit_code == 2 and "nowhere" in res.output


def test_serve_answers_the_openai_client_over_http(tmp_path) -> None:
    openai = pytest.importorskip("openai")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "feedbackrl.cli", "serve", "tiny", "--port", "0", "--name", "tiny"],
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        # printed once the socket listens (requests wait in its backlog until the server takes them)
        line = next((ln for ln in proc.stderr if ln.startswith("serving") or ln.startswith("error")), "")
        assert line.startswith("serving tiny as 'tiny' on http://127.0.0.1:"), line
        base = line.split(" on ")[1].split()[0]  # http://127.0.0.1:PORT/v1
        assert json.load(urllib.request.urlopen(f"{base}/models", timeout=300))["data"][0]["id"] == "tiny"
        client = openai.OpenAI(base_url=base, api_key="local", timeout=300)
        msgs = [{"role": "user", "content": "12+30="}]
        full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, seed=4)
        chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, seed=4, stream=True,
                                                     stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens >= 1
        req = urllib.request.Request(base.removesuffix("/v1") + "/inference/v1/generate", method="POST",
                                     data=json.dumps({"token_ids": [5, 6], "sampling_params": {"max_tokens": 3}})
                                     .encode(), headers={"Content-Type": "application/json"})
        out = json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]
        assert 1 <= len(out["token_ids"]) <= 3 and len(out["logprobs"]["content"]) == len(out["token_ids"])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
