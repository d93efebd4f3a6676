"""Clips (segment-pair items) through the API and pages, on SQLite and PostgreSQL: an admin uploads GIFs, an item
names them, only the project's members can fetch them, and malformed uploads or references are refused with
nothing stored."""

from __future__ import annotations

import base64
import hashlib

import pytest
from conftest import auth, count_rows, make_world
from fastapi.testclient import TestClient

from feedbackrl.feedback.app import create_app
from feedbackrl.feedback.clips import CLIP_MAX

# the smallest valid GIF89a: one transparent pixel
PIXEL = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")
OTHER = PIXEL.replace(b"\xff\xff\xff", b"\xfe\xfe\xfe")


def upload(c, project, data: bytes, token, **extra):
    return c.post(f"/api/projects/{project}/clips", headers=auth(token),
                  json={"data": base64.b64encode(data).decode(), **extra})


@pytest.fixture
def world_client(sessions):
    world = make_world(sessions, rows=[])
    with TestClient(create_app(sessions=sessions)) as client:
        yield world, client


def test_a_segment_pair_item_shows_its_two_clips_to_members_only(world_client, sessions):
    w, c = world_client
    r1, r2 = upload(c, w.p1, PIXEL, w.admin), upload(c, w.p1, OTHER, w.admin)
    assert r1.status_code == r2.status_code == 201, r1.text
    ref1, ref2 = r1.json()["ref"], r2.json()["ref"]
    assert ref1 == "clip:" + hashlib.sha256(PIXEL).hexdigest() and ref1 != ref2
    again = upload(c, w.p1, PIXEL, w.admin)  # content-addressed: stored once, answered 200
    assert again.status_code == 200 and again.json() == {"ref": ref1, "created": False}
    assert count_rows(sessions)["clips"] == 2
    item = c.post(f"/api/projects/{w.p1}/items", headers=auth(w.admin),
                  json={"items": [{"prompt": "which segment is better?", "responses": [ref1, ref2]}]})
    assert item.status_code == 201, item.text
    digest = ref1.removeprefix("clip:")
    got = c.get(f"/projects/{w.p1}/clips/{digest}", headers=auth(w.alice))
    assert got.status_code == 200 and got.content == PIXEL and got.headers["content-type"] == "image/gif"
    assert "private" in got.headers["cache-control"] and got.headers["x-content-type-options"] == "nosniff"
    # the page shows both clips as images
    c.cookies.set("feedbackrl_token", w.alice)
    page = c.get(f"/projects/{w.p1}").text
    assert page.count('<img class="clip"') == 2 and f"/projects/{w.p1}/clips/{digest}" in page
    assert 'id="btn-replay"' in page
    c.cookies.clear()
    # mallory (another project), nobody, and the clip asked for under her own project: all refused alike
    assert c.get(f"/projects/{w.p1}/clips/{digest}", headers=auth(w.mallory)).status_code == 404
    assert c.get(f"/projects/{w.p2}/clips/{digest}", headers=auth(w.mallory)).status_code == 404
    assert c.get(f"/projects/{w.p1}/clips/{digest}", follow_redirects=False).status_code == 303  # to /login
    # a labeller may not upload
    assert upload(c, w.p1, b"GIF89a" + b"\0" * 10, w.alice).status_code == 403


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"data": "not base64!"}, 422, "must be base64"),
    ({"data": base64.b64encode(b"\x89PNG\r\n\x1a\n....").decode()}, 422, "is not image/gif"),
    ({"data": base64.b64encode(PIXEL).decode(), "media_type": "video/mp4"}, 422, "media_type must be one of"),
    ({"data": base64.b64encode(b"GIF89a" + b"\0" * CLIP_MAX).decode()}, 422, "a clip must be 1.."),
    ({"data": base64.b64encode(PIXEL).decode(), "extra": 1}, 422, "extra"),
])
def test_bad_uploads_store_nothing(world_client, sessions, body, status, message):
    w, c = world_client
    before = count_rows(sessions)
    r = c.post(f"/api/projects/{w.p1}/clips", headers=auth(w.admin), json=body)
    assert r.status_code == status and message in r.json()["error"], r.text
    assert count_rows(sessions) == before


def test_items_naming_unknown_or_foreign_clips_are_refused(world_client, sessions):
    w, c = world_client
    ref = upload(c, w.p2, PIXEL, w.admin).json()["ref"]  # a clip of the other project
    mine = upload(c, w.p1, OTHER, w.admin).json()["ref"]
    before = count_rows(sessions)
    for responses, message in (([ref, mine], f"no clip {ref} in this project"),
                               ([mine, "a text answer"], "mix clips and text"),
                               ([mine, "clip:" + "0" * 64], "upload it first")):
        r = c.post(f"/api/projects/{w.p1}/items", headers=auth(w.admin),
                   json={"items": [{"prompt": "p", "responses": responses}]})
        assert r.status_code == 422 and message in r.json()["error"], r.text
    assert count_rows(sessions) == before
    assert c.get(f"/projects/{w.p1}/clips/not-a-digest", headers=auth(w.alice)).status_code == 404
