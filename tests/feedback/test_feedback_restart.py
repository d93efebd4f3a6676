"""200 concurrent labellers against a server process that is killed and restarted mid-run, on SQLite
and PostgreSQL: every acknowledged label is stored exactly once, retries of a submit whose answer
was lost return the stored label, and the per-item label counts match the labels.

The restart is triggered by a count of acknowledged labels and half of the labellers wait for it
before their second label, so labels are acknowledged on both sides of the kill whatever the
machine's speed. Traffic is loopback only and bounded in count (2 labels and 2 replays each).
"""

from __future__ import annotations

import asyncio

import httpx
from conftest import auth, pair_rows
from sqlalchemy import func, select

from feedbackrl.feedback.items import add_items
from feedbackrl.feedback.server import ServerProcess
from feedbackrl.feedback.store import Item, Label, Labeller, add_member, create_labeller, create_project

LABELLERS = 200
RESTART_AFTER = LABELLERS  # acknowledged labels before the kill; the waiting half hold 100 back until after


def _setup(sessions) -> tuple[int, list[int], dict[str, str]]:
    with sessions() as s:
        project = create_project(s, "restart", "pairwise", overlap=3)
        tokens = {}
        for i in range(LABELLERS):
            who, tokens[f"l{i:03d}"] = create_labeller(s, f"l{i:03d}")
            add_member(s, project, who)
        s.commit()
        return project.id, add_items(s, project, pair_rows(LABELLERS)), tokens


async def _post(c: httpx.AsyncClient, token: str, path: str, body: dict) -> httpx.Response:
    """Send until the server answers other than 503: a cut connection is retried with the same body."""
    while True:
        try:
            r = await c.post(path, json=body, headers=auth(token))
        except httpx.TransportError:
            await asyncio.sleep(0.1)
            continue
        if r.status_code != 503:
            return r
        await asyncio.sleep(0.1)


async def _run(server: ServerProcess, project: int, items: list[int], tokens: dict[str, str]) -> dict:
    acked: dict[tuple[str, str], tuple[int, str, int]] = {}
    replays: list[tuple[int, bool, bool]] = []  # (status, created, same label id) of each retry
    enough, restarted = asyncio.Event(), asyncio.Event()
    path = f"/api/projects/{project}/labels"

    async def submit(c: httpx.AsyncClient, name: str, sid: str, item: int, choice: str) -> dict:
        r = await _post(c, tokens[name], path, {"submission_id": sid, "item_id": item, "choice": choice})
        assert r.status_code in (200, 201), r.text
        label = r.json()["label"]
        acked[(name, sid)] = (item, choice, label["id"])
        if len(acked) >= RESTART_AFTER:
            enough.set()
        return label

    async def labeller(c: httpx.AsyncClient, k: int, name: str, token: str) -> None:
        first = await submit(c, name, f"{name}-0", items[k], "ab"[k % 2])
        # the answer to that submit was lost: the client retries it, and gets the stored label back
        r = await _post(c, token, path, {"submission_id": f"{name}-0", "item_id": items[k], "choice": "ab"[k % 2]})
        replays.append((r.status_code, r.json()["created"], r.json()["label"]["id"] == first["id"]))
        if k % 2 == 0:
            await restarted.wait()
        await submit(c, name, f"{name}-1", items[(k + 1) % LABELLERS], "tie")
        if k % 2 == 0:  # a retry of a submit sent before the kill, answered by the new process
            r = await _post(c, token, path, {"submission_id": f"{name}-0", "item_id": items[k], "choice": "ab"[k % 2]})
            replays.append((r.status_code, r.json()["created"], r.json()["label"]["id"] == first["id"]))

    async def restart() -> tuple[int, int]:
        await enough.wait()
        old = server.proc.pid
        await asyncio.to_thread(server.restart)
        await asyncio.to_thread(server.wait_ready, 120)
        before = len(acked)
        restarted.set()
        return old, before

    # one connection per labeller, each request with its labeller's token
    limits = httpx.Limits(max_connections=LABELLERS, max_keepalive_connections=LABELLERS)
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as c:
        *_, (old_pid, acked_before) = await asyncio.gather(
            *(labeller(c, k, name, token) for k, (name, token) in enumerate(tokens.items())), restart()
        )
    return {"acked": acked, "replays": replays, "old_pid": old_pid, "acked_before": acked_before}


def test_two_hundred_labellers_lose_nothing_across_a_server_kill(sessions, db_url):
    project, items, tokens = _setup(sessions)
    with ServerProcess(db_url) as server:
        run = asyncio.run(_run(server, project, items, tokens))
        assert server.proc.pid != run["old_pid"]
    acked = run["acked"]
    assert len(acked) == 2 * LABELLERS
    assert RESTART_AFTER <= run["acked_before"] <= 2 * LABELLERS - LABELLERS // 2  # the waiting half came after
    assert run["replays"] == [(200, False, True)] * (LABELLERS + LABELLERS // 2)
    with sessions() as s:
        stored = {
            (name, sid): (item, choice, label_id)
            for name, sid, item, choice, label_id in s.execute(
                select(Labeller.name, Label.submission_id, Label.item_id, Label.choice, Label.id).join(
                    Labeller, Labeller.id == Label.labeller_id
                )
            )
        }
        rows = s.scalar(select(func.count()).select_from(Label))
        counts = dict(s.execute(select(Item.id, Item.labels_count)).all())
    assert rows == len(stored) == 2 * LABELLERS and stored == acked
    # labeller k labelled items k and k+1: every item has exactly two labels, neither a skip
    assert counts == dict.fromkeys(items, 2)
