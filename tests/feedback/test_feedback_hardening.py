"""The labelling app's hardening, on SQLite and PostgreSQL: each hole answered with a clear 4xx and
the database unchanged; security headers on every response; the API deaf to the cookie; revoking
a labeller; the SQLite file private to its owner."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
from conftest import auth, count_rows, make_world
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from feedbackrl.cli import app as cli
from feedbackrl.feedback.app import create_app
from feedbackrl.feedback.auth import COOKIE
from feedbackrl.feedback.store import open_db

HUGE = [2**31, 2**63, 2**64 + 5]  # past the INTEGER columns (PostgreSQL: 32-bit), SQLite's 64-bit, both
OUT_OF_RANGE = "Input should be less than or equal to 2147483647"


@pytest.fixture
def world_client(sessions):
    world = make_world(sessions)
    with TestClient(create_app(sessions=sessions)) as client:
        yield world, client


def refused(response, status: int, message: str) -> None:
    assert response.status_code == status, response.text
    assert message in response.json()["error"], response.json()


def test_security_headers_on_every_response(world_client) -> None:
    w, c = world_client
    c.cookies.set(COOKIE, w.alice)
    responses = [c.get("/login"), c.get(f"/projects/{w.p1}"), c.get("/api/projects", headers=auth(w.alice)),
                 c.get("/api/projects/999/next", headers=auth(w.alice)),
                 c.post("/api/projects", content=b"x" * (5 << 20), headers=auth(w.admin))]
    assert [r.status_code for r in responses] == [200, 200, 200, 404, 413]
    for r in responses:
        nonce = re.fullmatch(r"default-src 'none'; script-src 'nonce-([\w-]+)'; style-src 'unsafe-inline'; "
                             r"img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
                             r.headers["content-security-policy"])
        assert nonce, r.headers["content-security-policy"]
        assert (r.headers["x-frame-options"], r.headers["x-content-type-options"], r.headers["referrer-policy"]) == (
            "DENY", "nosniff", "same-origin")
    # the label page's one inline script carries this response's nonce, so the policy lets it run
    page, policy = responses[1].text, responses[1].headers["content-security-policy"]
    nonce = re.search(r"nonce-([\w-]+)", policy)[1]
    assert re.findall(r"<script[^>]*>", page) == [f'<script nonce="{nonce}">']


@pytest.mark.parametrize("headers", [{"Origin": "http://evil.example"}, {"Referer": "http://evil.example/x"},
                                     {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"}], ids=str)
def test_cross_site_login_is_refused(world_client, headers: dict) -> None:
    w, c = world_client
    r = c.post("/login", data={"token": w.alice}, headers=headers, follow_redirects=False)
    assert r.status_code == 403 and "cross-site form post refused" in r.text, r.text
    assert COOKIE not in r.cookies and "set-cookie" not in r.headers
    same = c.post("/login", data={"token": w.alice}, headers={"Origin": "http://testserver"}, follow_redirects=False)
    assert same.status_code == 303 and same.cookies[COOKIE] == w.alice


def test_cross_site_label_form_is_refused_and_stores_nothing(world_client, sessions) -> None:
    w, c = world_client
    c.cookies.set(COOKIE, w.alice)
    csrf = re.search(r'name="csrf" value="([^"]+)"', c.get(f"/projects/{w.p1}").text)[1]
    before = count_rows(sessions)
    form = {"csrf": csrf, "submission_id": "x1", "item_id": str(w.items1[0]), "choice": "a"}
    r = c.post(f"/projects/{w.p1}/label", data=form, headers={"Origin": "http://evil.example"},
               follow_redirects=False)
    assert r.status_code == 403 and "cross-site form post refused" in r.text
    assert count_rows(sessions) == before


@pytest.mark.parametrize("huge", HUGE)
def test_ids_past_the_columns_are_4xx(world_client, sessions, huge: int) -> None:
    w, c = world_client
    before, a = count_rows(sessions), auth(w.admin)
    refused(c.get(f"/api/projects/{huge}/next", headers=a), 422, OUT_OF_RANGE)
    refused(c.get(f"/api/projects/{w.p1}/items/{huge}", headers=a), 422, OUT_OF_RANGE)
    refused(c.get(f"/api/projects/{w.p1}/export?since_id={huge}", headers=a), 422, OUT_OF_RANGE)
    body = {"submission_id": "s1", "item_id": huge, "choice": "a"}
    refused(c.post(f"/api/projects/{w.p1}/labels", json=body, headers=auth(w.alice)), 422, OUT_OF_RANGE)
    refused(c.post(f"/api/projects/{w.p1}/undo", json={"label_id": huge}, headers=auth(w.alice)), 422, OUT_OF_RANGE)
    c.cookies.set(COOKIE, w.alice)
    assert c.get(f"/projects/{huge}").status_code == 422
    assert count_rows(sessions) == before


@pytest.mark.parametrize(("row", "message"), [
    pytest.param('{"prompt": "a\\ud800b", "responses": ["x", "y"]}', "row 0: 'prompt' contains a lone surrogate "
                 "(U+D800 at character 1)", id="lone-surrogate-prompt"),
    pytest.param('{"prompt": "p", "responses": ["x\\u0000", "y"]}', "row 0: response 0 contains a NUL byte "
                 "(\\u0000 at character 1)", id="nul-in-response"),
    pytest.param('{"prompt": "p", "responses": ["x", "y"], "meta": {"k\\u0000": 1}}', "row 0: metadata['meta'] key "
                 "'k\\x00' contains a NUL byte", id="nul-in-metadata-key"),
    pytest.param('{"prompt": "p", "responses": ["x", "y"], "m": ' + "[" * 17 + "]" * 17 + "}",
                 "row 0: metadata['m']" + "[0]" * 15 + " is nested more than 16 levels deep", id="nested-17"),
])
def test_bad_item_text_is_4xx_and_stores_nothing(world_client, sessions, row: str, message: str) -> None:
    w, c = world_client
    before = count_rows(sessions)
    good = '{"prompt": "fine", "responses": ["1", "2"]}'
    r = c.post(f"/api/projects/{w.p1}/items", content=f'{{"items": [{row}, {good}]}}',
               headers={**auth(w.admin), "Content-Type": "application/json"})
    refused(r, 422, message)
    assert count_rows(sessions) == before


def test_metadata_600_deep_is_refused(world_client, sessions) -> None:
    w, c = world_client
    before = count_rows(sessions)
    deep = '{"prompt": "p", "responses": ["x", "y"], "m": ' + "[" * 600 + "]" * 600 + "}"
    r = c.post(f"/api/projects/{w.p1}/items", content=f'{{"items": [{deep}]}}',
               headers={**auth(w.admin), "Content-Type": "application/json"})
    refused(r, 422, "row 0: metadata['m']" + "[0]" * 15 + " is nested more than 16 levels deep")
    assert count_rows(sessions) == before
    ok = {"prompt": "p", "responses": ["x", "y"], "m": json.loads("[" * 15 + "]" * 15)}
    assert c.post(f"/api/projects/{w.p1}/items", json={"items": [ok]}, headers=auth(w.admin)).status_code == 201


def test_nul_in_a_label_reason_is_4xx(world_client, sessions) -> None:
    w, c = world_client
    before = count_rows(sessions)
    body = {"submission_id": "s1", "item_id": w.items1[0], "choice": "a", "reason": "because\x00"}
    refused(c.post(f"/api/projects/{w.p1}/labels", json=body, headers=auth(w.alice)), 422,
            "reason contains a NUL byte")
    assert count_rows(sessions) == before


def test_the_api_ignores_the_login_cookie(world_client, sessions) -> None:
    w, c = world_client
    c.cookies.set(COOKIE, w.admin)
    assert c.get("/").status_code == 200  # pages take the cookie
    before = count_rows(sessions)
    refused(c.get("/api/projects"), 401, "missing or unknown token")
    refused(c.post("/api/projects", json={"name": "csrf", "kind": "pairwise"}), 401, "missing or unknown token")
    assert count_rows(sessions) == before


@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_json_without_a_json_content_type_is_refused(world_client, sessions, content_type: str | None) -> None:
    w, c = world_client
    before = count_rows(sessions)
    headers = auth(w.admin) | ({"Content-Type": content_type} if content_type else {})
    r = c.post("/api/projects", content=b'{"name": "x", "kind": "pairwise"}', headers=headers)
    assert r.status_code == 422, r.text
    assert count_rows(sessions) == before


def test_revoking_a_labeller(world_client, sessions) -> None:
    w, c = world_client
    label = {"submission_id": "s1", "item_id": w.items1[0], "choice": "a"}
    assert c.post(f"/api/projects/{w.p1}/labels", json=label, headers=auth(w.alice)).status_code == 201
    refused(c.delete("/api/labellers/bob", headers=auth(w.alice)), 403, "is not an admin")
    refused(c.delete("/api/labellers/admin", headers=auth(w.admin)), 409, "cannot revoke yourself")
    refused(c.delete("/api/labellers/nobody", headers=auth(w.admin)), 404, "no labeller named 'nobody'")
    assert c.delete("/api/labellers/alice", headers=auth(w.admin)).json() == {"revoked": "alice"}
    refused(c.get("/api/projects", headers=auth(w.alice)), 401, "missing or unknown token")
    c.cookies.set(COOKIE, w.alice)
    assert c.get("/", follow_redirects=False).headers["location"] == "/login"
    labels = c.get(f"/api/projects/{w.p1}/labels", headers=auth(w.admin)).json()
    assert [x["item_id"] for x in labels] == [w.items1[0]]  # her labels stay
    assert count_rows(sessions)["memberships"] == 2  # bob's and mallory's


def test_revoke_from_the_cli(tmp_path) -> None:
    db = str(tmp_path / "f.db")
    runner = CliRunner()
    assert runner.invoke(cli, ["label", "admin-token", "--db", db]).exit_code == 0
    token = runner.invoke(cli, ["label", "invite", "--db", db, "p", "ann"])
    assert token.exit_code != 0  # no project 'p' yet
    runner.invoke(cli, ["label", "create-project", "p", "--kind", "pairwise", "--db", db])
    token = runner.invoke(cli, ["label", "invite", "p", "ann", "--db", db]).stdout.strip()
    out = runner.invoke(cli, ["label", "revoke", "ann", "--db", db])
    assert out.exit_code == 0 and "'ann' is revoked" in out.stdout
    with TestClient(create_app(db)) as c:
        refused(c.get("/api/projects", headers=auth(token)), 401, "missing or unknown token")


def test_sqlite_file_is_created_owner_only(tmp_path) -> None:
    path = tmp_path / "new.db"
    old = os.umask(0o022)  # the usual umask would leave it world-readable
    try:
        world = make_world(open_db(str(path)))
    finally:
        os.umask(old)
    assert world.p1 == 1
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes and set(modes.values()) == {0o600}, modes  # the database and its -wal/-shm files
