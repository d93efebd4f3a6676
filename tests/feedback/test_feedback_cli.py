"""`feedbackrl label ...` end to end on a SQLite file: admin token, project, invitation, import,
fill from a tiny checkpoint, `serve` as a real process on 127.0.0.1 taking a label over HTTP,
export read back by `load_preference_pairs`, and user errors exiting 2 with a clear message."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from conftest import auth
from typer.testing import CliRunner

from feedbackrl.cli import app
from feedbackrl.data.preferences import load_preference_pairs

runner = CliRunner()


def label(*args: str) -> str:
    result = runner.invoke(app, ["label", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(db: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-c", "from feedbackrl.cli import app; app()", "label", "serve", "--db", str(db),
           "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/login", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"`label serve` did not come up: {proc.communicate(timeout=10)[0]}")


def test_label_commands_end_to_end(tmp_path, tiny_model_dir):
    db = tmp_path / "feedback.db"
    d = ["--db", str(db)]
    admin = label("admin-token", *d)
    assert len(admin) >= 40
    assert label("create-project", "demo", "--kind", "pairwise", *d) == "project 'demo' (id 1, pairwise, overlap 1)"
    token = label("invite", "demo", "ann", *d)
    assert "still works" in label("invite", "demo", "ann", *d)  # a second invitation prints no new token
    rows = [{"prompt": f"q{i}", "responses": [f"yes {i}", f"no {i}"], "source": "hand"} for i in range(3)]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert label("import", "demo", str(tmp_path / "items.jsonl"), *d) == "imported 3 item(s) into 'demo'"
    (tmp_path / "prompts.txt").write_text("1+2=\n3+4=\n")
    filled = label("fill", "demo", "--model", str(tiny_model_dir), "--prompts", str(tmp_path / "prompts.txt"),
                   "--samples", "4", "--max-new-tokens", "8", *d)
    assert filled.startswith("added ") and filled.endswith(f"item(s) to 'demo' from {tiny_model_dir}")

    proc, url = serve(db)
    try:
        with httpx.Client(base_url=url, headers=auth(token), timeout=10) as c:
            for n in range(2):
                item = c.get("/api/projects/1/next").json()["item"]
                r = c.post("/api/projects/1/labels", json={"submission_id": f"s{n}", "item_id": item["id"],
                                                            "choice": "ab"[n], "reason": f"r{n}"})
                assert r.status_code == 201, r.text
            assert c.get("/api/projects", headers=auth("wrong")).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=20)

    out = tmp_path / "pairs.jsonl"
    assert label("export", "demo", "--out", str(out), *d) == f"wrote 2 pairs row(s) to {out}"
    pairs, dropped = load_preference_pairs(out)
    assert dropped == [] and [p.meta["reason"] for p in pairs] == ["r0", "r1"]
    assert all(p.meta["labeller"] == "ann" and p.meta["project"] == "demo" for p in pairs)
    label("export", "demo", "--out", str(tmp_path / "raw.jsonl"), "--format", "labels", *d)
    assert len((tmp_path / "raw.jsonl").read_text().splitlines()) == 2


def test_label_commands_report_user_errors(tmp_path):
    d = ["--db", str(tmp_path / "f.db")]
    cases = [
        (["create-project", "x", "--kind", "stars"], "project kind must be one of pairwise, ranking, accept_reject"),
        (["import", "nope", str(tmp_path)], "no such file"),
        (["export", "nope", "--out", str(tmp_path / "o.jsonl")], "no project named 'nope'; projects: none yet"),
        (["export", "nope", "--out", "o.jsonl", "--format", "csv"], "--format must be one of pairs, rankings, labels"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["label", *args, *d])
        assert result.exit_code == 2 and message in result.output, (args, result.output)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "p", "responses": ["a", "b"]}\n{"prompt": \n')
    label("create-project", "p", *d)
    result = runner.invoke(app, ["label", "import", "p", str(tmp_path / "bad.jsonl"), *d])
    assert result.exit_code == 2 and "line 2 is not valid JSON" in result.output
