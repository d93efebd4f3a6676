"""A real uvicorn server on 127.0.0.1, on SQLite and PostgreSQL: access control over the wire,
20 labellers submitting concurrently (with retries) ending with exactly the labels sent, and a
burst of identical retries storing one label. Traffic is loopback only and bounded in count."""

from __future__ import annotations

import random
import threading
import time

import httpx
from conftest import LiveServer, auth, count_rows, make_world, pair_rows
from sqlalchemy import select

from feedbackrl.feedback.app import create_app
from feedbackrl.feedback.items import add_items
from feedbackrl.feedback.store import Label, Labeller, add_member, create_labeller, create_project

LABELLERS = 20
LABELS_EACH = 6  # 120 labels; every third one is sent twice (a retry)


def test_access_control_over_real_http(sessions):
    w = make_world(sessions)
    with LiveServer(create_app(sessions=sessions)) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        assert c.get(f"/api/projects/{w.p1}/next").status_code == 401
        assert c.get(f"/api/projects/{w.p1}/next", headers=auth(w.mallory)).status_code == 404
        r = c.post(f"/api/projects/{w.p1}/labels", headers=auth(w.mallory),
                   json={"submission_id": "x", "item_id": w.items1[0], "choice": "a"})
        assert r.status_code == 404 and "not shared with 'mallory'" in r.json()["error"]
        assert c.post("/api/projects", headers=auth(w.alice), json={"name": "x", "kind": "pairwise"}).status_code == 403
        item = c.get(f"/api/projects/{w.p1}/next", headers=auth(w.alice)).json()["item"]
        assert item["id"] in w.items1
    assert count_rows(sessions)["labels"] == 0


def _setup_load(sessions) -> tuple[int, dict[str, str]]:
    with sessions() as s:
        project = create_project(s, "load", "pairwise", overlap=3)
        tokens = {}
        for i in range(LABELLERS):
            who, tokens[f"labeller{i:02d}"] = create_labeller(s, f"labeller{i:02d}")
            add_member(s, project, who)
        s.commit()
        add_items(s, project, pair_rows(100))
        return project.id, tokens


def _labeller(url: str, project: int, name: str, token: str, start: threading.Barrier,
              sent: dict, statuses: list) -> None:
    rng = random.Random(name)
    with httpx.Client(base_url=url, headers=auth(token), timeout=30) as c:
        start.wait(timeout=30)
        for i in range(LABELS_EACH):
            item = c.get(f"/api/projects/{project}/next").json()["item"]
            body = {"submission_id": f"{name}-{i}", "item_id": item["id"], "choice": rng.choice("ab"),
                    "reason": f"{name} says {i}"}
            tries = 2 if i % 3 == 0 else 1
            for _ in range(tries):
                statuses.append(c.post(f"/api/projects/{project}/labels", json=body).status_code)
            sent[(name, body["submission_id"])] = (body["item_id"], body["choice"])


def _run_all(threads: list[threading.Thread]) -> float:
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    return time.perf_counter() - t0


def _send_once(url: str, token: str, path: str, body: dict, start: threading.Barrier, results: list) -> None:
    with httpx.Client(base_url=url, headers=auth(token), timeout=30) as c:
        start.wait(timeout=30)
        r = c.post(path, json=body)
        results.append((r.status_code, r.json().get("created")))


def test_twenty_concurrent_labellers_end_with_exactly_the_labels_sent(sessions, db_url):
    """Phase 1: 20 labellers label concurrently, retrying some submissions. Phase 2: one labeller's
    submission arrives 20 times at once (a client retrying hard): one label, 19 replays."""
    project, tokens = _setup_load(sessions)
    sent: dict = {}
    statuses: list[int] = []
    start = threading.Barrier(LABELLERS)
    with LiveServer(create_app(sessions=sessions)) as server:
        seconds = _run_all([threading.Thread(target=_labeller, args=(server.url, project, n, t, start, sent, statuses))
                            for n, t in tokens.items()])
        name, token = next(iter(tokens.items()))
        with httpx.Client(base_url=server.url, headers=auth(token)) as c:
            item = c.get(f"/api/projects/{project}/next").json()["item"]["id"]
        burst: list = []
        body = {"submission_id": "burst", "item_id": item, "choice": "b"}
        start = threading.Barrier(LABELLERS)
        _run_all([threading.Thread(target=_send_once, args=(server.url, token, f"/api/projects/{project}/labels",
                                                           body, start, burst)) for _ in range(LABELLERS)])
    retries = LABELLERS * len(range(0, LABELS_EACH, 3))
    requests = 2 * LABELLERS * LABELS_EACH + retries
    report = (f"{db_url.split(':')[0]}: {LABELLERS} labellers, {requests} requests in {seconds:.1f} s "
              f"({requests / seconds:.0f} req/s)")
    print(report)
    assert sorted(set(statuses)) == [200, 201], report
    assert statuses.count(201) == LABELLERS * LABELS_EACH and statuses.count(200) == retries, report
    with sessions() as s:
        stored = {(name, sid): (item, choice) for name, sid, item, choice in s.execute(
            select(Labeller.name, Label.submission_id, Label.item_id, Label.choice)
            .join(Labeller, Labeller.id == Label.labeller_id))}
    assert len(sent) == LABELLERS * LABELS_EACH and stored == {**sent, (name, "burst"): (item, "b")}, report
    assert sorted(burst) == [(200, False)] * (LABELLERS - 1) + [(201, True)], burst
