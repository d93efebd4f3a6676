"""The HTTP API and pages through FastAPI's TestClient, on SQLite and PostgreSQL: who may read and
write what, bad input answered with a clear 4xx and no change to the database, idempotent retries,
undo and progress, and the form flow of the labelling page."""

from __future__ import annotations

import json
import re

import pytest
from conftest import auth, count_rows, make_world
from fastapi.testclient import TestClient

from feedbackrl.feedback.app import create_app


@pytest.fixture
def world_client(sessions):
    world = make_world(sessions)
    with TestClient(create_app(sessions=sessions)) as client:
        yield world, client


def label(item: int, choice: str = "a", sid: str = "s1", **extra) -> dict:
    return {"submission_id": sid, "item_id": item, "choice": choice, **extra}


def test_each_labeller_sees_only_their_projects(world_client, sessions):
    w, c = world_client
    assert c.get("/api/projects").status_code == 401
    assert c.get("/api/projects", headers=auth("not-a-token")).json()["error"].startswith("missing or unknown token")
    assert [p["name"] for p in c.get("/api/projects", headers=auth(w.alice)).json()] == ["p1"]
    assert [p["name"] for p in c.get("/api/projects", headers=auth(w.mallory)).json()] == ["p2"]
    assert [p["name"] for p in c.get("/api/projects", headers=auth(w.admin)).json()] == ["p1", "p2"]
    # bob's label on p1 is invisible to alice
    assert c.post(f"/api/projects/{w.p1}/labels", json=label(w.items1[0]), headers=auth(w.bob)).status_code == 201
    assert c.get(f"/api/projects/{w.p1}/labels", headers=auth(w.alice)).json() == []
    assert len(c.get(f"/api/projects/{w.p1}/labels", headers=auth(w.admin)).json()) == 1


def test_nobody_reads_or_writes_another_projects_items_or_labels(world_client, sessions):
    w, c = world_client
    before = count_rows(sessions)
    m = auth(w.mallory)
    reads = [f"/api/projects/{w.p1}/next", f"/api/projects/{w.p1}/items/{w.items1[0]}",
             f"/api/projects/{w.p2}/items/{w.items1[0]}", f"/api/projects/{w.p1}/progress",
             f"/api/projects/{w.p1}/labels", f"/projects/{w.p1}"]
    for url in reads:
        r = c.get(url, headers=m)
        assert r.status_code == 404, (url, r.text)
        assert "good 0" not in r.text and "prompt 0" not in r.text
    writes = [(f"/api/projects/{w.p1}/labels", label(w.items1[0])),
              (f"/api/projects/{w.p2}/labels", label(w.items1[0])),  # own project, foreign item
              (f"/api/projects/{w.p1}/undo", {})]
    for url, body in writes:
        assert c.post(url, json=body, headers=m).status_code == 404, url
    admin_only = [(f"/api/projects/{w.p2}/items", {"items": [{"prompt": "x", "responses": ["a", "b"]}]}),
                  ("/api/projects", {"name": "mine", "kind": "pairwise"}),
                  ("/api/labellers", {"name": "eve", "admin": True}),
                  (f"/api/projects/{w.p1}/members", {"labeller": "mallory"})]
    for url, body in admin_only:
        r = c.post(url, json=body, headers=m)
        assert r.status_code == 403 and "not an admin" in r.json()["error"], url
    assert c.get(f"/api/projects/{w.p2}/export", headers=m).status_code == 403
    assert count_rows(sessions) == before


def test_admin_creates_a_project_and_invites_a_labeller(world_client, sessions):
    w, c = world_client
    a = auth(w.admin)
    project = c.post("/api/projects", json={"name": "new", "kind": "accept_reject", "overlap": 2}, headers=a).json()
    token = c.post("/api/labellers", json={"name": "carol"}, headers=a).json()["token"]
    assert c.get("/api/projects", headers=auth(token)).json() == []
    assert c.post(f"/api/projects/{project['id']}/members", json={"labeller": "carol"}, headers=a).json()["added"]
    items = c.post(f"/api/projects/{project['id']}/items", json={"items": [{"prompt": "q", "response": "r"}]},
                   headers=a)
    assert items.status_code == 201
    nxt = c.get(f"/api/projects/{project['id']}/next", headers=auth(token)).json()["item"]
    assert (nxt["prompt"], nxt["responses"], nxt["kind"]) == ("q", ["r"], "accept_reject")
    r = c.post(f"/api/projects/{project['id']}/labels", json=label(nxt["id"], "accept"), headers=auth(token))
    assert r.status_code == 201
    assert c.post("/api/projects", json={"name": "new", "kind": "pairwise"}, headers=a).status_code == 409


BAD = [
    ("unknown-item", lambda w: label(99999), 404, "item 99999 not found in project"),
    ("wrong-kind", lambda w: label(w.items1[0], "accept"), 422,
     "is a pairwise item: choice must be one of a, b, tie, skip; got 'accept'"),
    ("ranking-on-pair", lambda w: label(w.items1[0], "a", ranking=[1, 0]), 422, "ranking is only for choice"),
    ("oversized-reason", lambda w: label(w.items1[0], reason="x" * 2001), 422,
     "reason: String should have at most 2000 characters"),
    ("missing-field", lambda w: {"submission_id": "s", "item_id": w.items1[0]}, 422, "choice: Field required"),
    ("extra-field", lambda w: label(w.items1[0], score=3), 422, "score: Extra inputs are not permitted"),
    ("bad-submission-id", lambda w: label(w.items1[0], sid="has space"), 422, "submission_id must be"),
    ("item-id-not-int", lambda w: label("abc"), 422, "item_id: Input should be a valid integer"),
]


@pytest.mark.parametrize(("make", "status", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_labels_get_a_clear_4xx_and_change_nothing(world_client, sessions, make, status, message):
    w, c = world_client
    before = count_rows(sessions)
    r = c.post(f"/api/projects/{w.p1}/labels", json=make(w), headers=auth(w.alice))
    assert r.status_code == status and message in r.json()["error"], r.text
    assert count_rows(sessions) == before


def test_malformed_json_oversized_bodies_and_bad_imports(world_client, sessions):
    w, c = world_client
    before = count_rows(sessions)
    h = {**auth(w.alice), "content-type": "application/json"}
    r = c.post(f"/api/projects/{w.p1}/labels", content=b'{"submission_id": "s1", "item_id": ', headers=h)
    assert r.status_code == 400 and r.json()["error"].startswith("malformed JSON body"), r.text
    r = c.post(f"/api/projects/{w.p1}/labels", content=b"[1, 2]", headers=h)
    assert r.status_code == 422, r.text
    huge = json.dumps(label(w.items1[0], reason="x" * (5 * 1024 * 1024)))
    r = c.post(f"/api/projects/{w.p1}/labels", content=huge, headers=h)
    assert r.status_code == 413 and "request body over" in r.json()["error"]
    rows = [{"prompt": "ok", "responses": ["a", "b"]}, {"prompt": "p", "responses": ["a"]}]
    r = c.post(f"/api/projects/{w.p1}/items", json={"items": rows}, headers=auth(w.admin))
    assert r.status_code == 422 and "row 1: a pairwise item needs exactly 2 responses, got 1" in r.json()["error"]
    r = c.post("/api/projects", json={"name": "x", "kind": "stars"}, headers=auth(w.admin))
    assert r.status_code == 422 and r.json()["error"].startswith("kind: Input should be")
    assert count_rows(sessions) == before


def test_retried_submissions_count_once(world_client, sessions):
    w, c = world_client
    url, h = f"/api/projects/{w.p1}/labels", auth(w.alice)
    first = c.post(url, json=label(w.items1[0], reason="because"), headers=h)
    retry = c.post(url, json=label(w.items1[0], reason="because"), headers=h)
    assert (first.status_code, first.json()["created"], retry.status_code, retry.json()["created"]) == (
        201, True, 200, False)
    assert retry.json()["label"] == first.json()["label"]
    reused = c.post(url, json=label(w.items1[1], "b"), headers=h)
    assert reused.status_code == 409 and "already used for a different label" in reused.json()["error"]
    assert count_rows(sessions)["labels"] == 1


def test_undo_and_progress_over_the_api(world_client):
    w, c = world_client
    p, a, b = f"/api/projects/{w.p1}", auth(w.alice), auth(w.bob)
    for n, item in enumerate(w.items1[:2]):
        assert c.post(f"{p}/labels", json=label(item, "a", f"a{n}"), headers=a).status_code == 201
        assert c.post(f"{p}/labels", json=label(item, "ab"[n], f"b{n}"), headers=b).status_code == 201
    prog = c.get(f"{p}/progress", headers=a).json()
    assert prog == {"done": 2, "skipped": 0, "remaining": 2, "total": 4, "agreement": 0.5, "agreement_pairs": 2}
    undone = c.post(f"{p}/undo", json={}, headers=a).json()["undone"]
    assert undone["item_id"] == w.items1[1] and undone["undone"]
    assert c.post(f"{p}/undo", json={"label_id": undone["id"]}, headers=a).json()["undone"] == undone
    assert c.get(f"{p}/progress", headers=a).json()["done"] == 1


def _form_fields(html: str) -> dict[str, str]:
    return dict(re.findall(r'name="(csrf|submission_id|item_id|label_id)" value="([^"]*)"', html))


def test_label_page_forms_with_csrf_and_undo(world_client, sessions):
    w, c = world_client
    assert c.get("/", follow_redirects=False).headers["location"] == "/login"
    assert c.post("/login", data={"token": "wrong"}).status_code == 401
    assert c.post("/login", data={"token": w.alice}, follow_redirects=False).status_code == 303
    assert "p1" in c.get("/").text and "p2" not in c.get("/").text
    page = c.get(f"/projects/{w.p1}")
    fields = _form_fields(page.text)
    assert page.status_code == 200 and 'data-kind="pairwise"' in page.text
    form = {k: fields[k] for k in ("submission_id", "item_id")} | {"choice": "a"}
    assert c.post(f"/projects/{w.p1}/label", data=form).status_code == 403  # no CSRF token
    assert count_rows(sessions)["labels"] == 0
    for _ in range(2):  # a double-submitted form stores one label
        r = c.post(f"/projects/{w.p1}/label", data=form | {"csrf": fields["csrf"]}, follow_redirects=False)
        assert r.status_code == 303
    assert count_rows(sessions)["labels"] == 1
    after = _form_fields(c.get(f"/projects/{w.p1}").text)
    assert after["item_id"] != fields["item_id"] and after["submission_id"] != fields["submission_id"]
    r = c.post(f"/projects/{w.p1}/undo", data={"csrf": after["csrf"], "label_id": after["label_id"]},
               follow_redirects=False)
    assert r.headers["location"] == f"/projects/{w.p1}?item={fields['item_id']}"
    assert _form_fields(c.get(r.headers["location"]).text)["item_id"] == fields["item_id"]
    wrong = c.post(f"/projects/{w.p1}/label", data=form | {"csrf": fields["csrf"], "choice": "accept",
                                                          "submission_id": "other"})
    assert wrong.status_code == 422 and "choice must be one of a, b, tie, skip" in wrong.text


def test_queue_refill_seam_status_and_new_pairs(world_client):
    """What an online loop uses over HTTP: queue counts, refill with items, pairs since a cursor."""
    w, c = world_client
    p, a = f"/api/projects/{w.p1}", auth(w.admin)
    assert c.get(f"{p}/status", headers=a).json() == {"items": 4, "open_items": 4, "labels": 0, "last_label_id": 0}
    for n, who in enumerate((w.alice, w.bob)):  # overlap 2: item 0 is then complete
        c.post(f"{p}/labels", json=label(w.items1[0], "a", f"s{n}"), headers=auth(who))
    status = c.get(f"{p}/status", headers=a).json()
    assert status == {"items": 4, "open_items": 3, "labels": 2, "last_label_id": status["last_label_id"]}
    new = c.post(f"{p}/items", json={"items": [{"prompt": "new", "responses": ["x", "y"]}]}, headers=a).json()
    c.post(f"{p}/labels", json=label(new["item_ids"][0], "b", "s9"), headers=auth(w.alice))
    assert c.get(f"{p}/status", headers=a).json()["items"] == 5
    newer = c.get(f"{p}/export", params={"since_id": status["last_label_id"]}, headers=a).json()
    assert [(r["prompt"], r["chosen"], r["rejected"]) for r in newer] == [("new", "y", "x")]
    c.post(f"{p}/labels", json=label(w.items1[1], "tie", "s10"), headers=auth(w.alice))
    assert len(c.get(f"{p}/export", params={"since_id": status["last_label_id"]}, headers=a).json()) == 1
    with_ties = c.get(f"{p}/export", params={"since_id": status["last_label_id"], "ties": True}, headers=a).json()
    assert [r.get("tie", False) for r in with_ties] == [False, True]
    assert (with_ties[1]["chosen"], with_ties[1]["rejected"]) == ("good 1", "bad 1")  # the item's order
    assert c.get(f"{p}/status", headers=auth(w.alice)).status_code == 403


def _login(c: TestClient, token: str) -> None:
    assert c.post("/login", data={"token": token}, follow_redirects=False).status_code == 303


def _shown(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'class="card response" data-index="(\d+)"', html)]


def test_ranking_form_maps_display_numbers_to_stored_indices(sessions):
    rows = [{"prompt": "<script>alert(1)</script>", "responses": ["x", "y", "z"]}]
    w = make_world(sessions, "ranking", rows=rows)
    with TestClient(create_app(sessions=sessions)) as c:
        _login(c, w.alice)
        page = c.get(f"/projects/{w.p1}").text
        assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        shown, fields = _shown(page), _form_fields(page)
        form = {k: fields[k] for k in ("csrf", "submission_id", "item_id")} | {"choice": "ranked"}
        bad = c.post(f"/projects/{w.p1}/label", data=form | {"order": "1 1 2"})
        assert bad.status_code == 422 and "order must list each of 1..3 once" in bad.text
        assert c.post(f"/projects/{w.p1}/label", data=form | {"order": "2 3 1"}).status_code == 200
        stored = c.get(f"/api/projects/{w.p1}/labels", headers=auth(w.alice)).json()
    assert [x["ranking"] for x in stored] == [[shown[1], shown[2], shown[0]]]


def test_accept_reject_form(sessions):
    w = make_world(sessions, "accept_reject", rows=[{"prompt": "q", "response": "r"}])
    with TestClient(create_app(sessions=sessions)) as c:
        _login(c, w.alice)
        page = c.get(f"/projects/{w.p1}").text
        assert 'id="btn-a"' in page and 'id="btn-r"' in page and 'id="btn-1"' not in page
        fields = _form_fields(page)
        form = {k: fields[k] for k in ("csrf", "submission_id", "item_id")} | {"choice": "reject", "reason": "off"}
        c.post(f"/projects/{w.p1}/label", data=form)
        stored = c.get(f"/api/projects/{w.p1}/labels", headers=auth(w.alice)).json()
    assert [(x["choice"], x["reason"]) for x in stored] == [("reject", "off")]
