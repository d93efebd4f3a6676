"""The labelling app under load: concurrent labellers against a real uvicorn process on PostgreSQL.

Each simulated labeller (asyncio + httpx, its own bearer token) loops for `--seconds`: fetch its
next item, submit a label, and, for every fifth label, send the submit again as a client does
when a response is lost (the replay must answer 200 with the same label id). Halfway through,
the server process is SIGKILLed and started again on the same socket; requests cut by the kill
are retried with the same `submission_id` until they get an answer. An admin keeps the queue
stocked through the API (4,000 items to start, 2,000 more whenever fewer are open). Afterwards
the database is read back: every acknowledged (2xx) label must be stored exactly once, with the
item and choice that were sent, and no labeller holds two active labels on one item.

    FEEDBACKRL_TEST_PG_URL=postgresql+psycopg://user:pw@127.0.0.1:5432/db \\
        python benchmarks/bench_labelling.py               # 200 labellers, 300 s
    python benchmarks/bench_labelling.py --seconds 20      # a short check

It creates a throwaway database next to the one in the URL (dropped afterwards), prints labels/s,
submit latency (p50, p99 of acknowledged submits), errors by kind, the CPU's instruction set, date
and commit, and writes benchmarks/results/labelling.json. Exits 1 if a label was lost or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, func, make_url, select, text

from feedbackrl.feedback.items import add_items
from feedbackrl.feedback.server import ServerProcess
from feedbackrl.feedback.store import (
    Label,
    Labeller,
    add_member,
    create_labeller,
    create_project,
    open_db,
    pool_connections,
)

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "labelling.json"
REFILL_BATCH = 2000  # items the admin adds when fewer than this are open
REPLAY_EVERY = 5  # every fifth label is submitted a second time (a client whose response was lost)
RETRY_S = 0.2  # pause before retrying a request the server did not answer


@dataclass
class Tally:
    """What the clients saw: acknowledged labels, latencies, errors and replays."""

    acked: dict[tuple[str, str], tuple[int, str, int]] = field(default_factory=dict)  # (name, sid) -> item, choice, id
    submit_ms: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    replays: int = 0
    bad_replays: list[str] = field(default_factory=list)
    empty_queue: int = 0


async def request(
    client: httpx.AsyncClient, tally: Tally, method: str, path: str, body: dict | None = None
) -> tuple[httpx.Response, float]:
    """Send until the server answers with something other than 503; -> (response, ms of that try)."""
    while True:
        t0 = time.perf_counter()
        try:
            r = await client.request(method, path, json=body)
        except httpx.TransportError as e:
            tally.errors[f"{method} {type(e).__name__}"] += 1
        else:
            if r.status_code != 503:
                return r, (time.perf_counter() - t0) * 1000
            tally.errors[f"{method} 503"] += 1
        await asyncio.sleep(RETRY_S)


async def labeller(url: str, project: int, name: str, token: str, deadline: float, tally: Tally) -> None:
    rng = random.Random(name)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60, limits=limits
    ) as c:
        n = 0
        while time.monotonic() < deadline:
            r, _ = await request(c, tally, "GET", f"/api/projects/{project}/next")
            if r.status_code != 200:
                tally.errors[f"GET {r.status_code}"] += 1
                continue
            item = r.json()["item"]
            if item is None:
                tally.empty_queue += 1
                await asyncio.sleep(0.5)
                continue
            body = {"submission_id": f"{name}-{n}", "item_id": item["id"], "choice": rng.choice(("a", "b", "tie"))}
            n += 1
            r, ms = await request(c, tally, "POST", f"/api/projects/{project}/labels", body)
            if r.status_code not in (200, 201):
                tally.errors[f"POST {r.status_code}"] += 1
                continue
            tally.submit_ms.append(ms)
            label = r.json()["label"]
            tally.acked[(name, body["submission_id"])] = (body["item_id"], body["choice"], label["id"])
            if n % REPLAY_EVERY == 0:
                again, _ = await request(c, tally, "POST", f"/api/projects/{project}/labels", body)
                tally.replays += 1
                if again.status_code != 200 or again.json()["label"]["id"] != label["id"]:
                    tally.bad_replays.append(f"{body['submission_id']}: {again.status_code} {again.text[:200]}")


def item_rows(start: int, n: int) -> list[dict[str, Any]]:
    return [{"prompt": f"prompt {i}", "responses": [f"first {i}", f"second {i}"]} for i in range(start, start + n)]


async def refill(url: str, admin: str, project: int, deadline: float, tally: Tally) -> int:
    """Keep at least REFILL_BATCH items open; -> items added."""
    added = 0
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=120) as c:
        while time.monotonic() < deadline:
            r, _ = await request(c, tally, "GET", f"/api/projects/{project}/status")
            if r.status_code == 200 and r.json()["open_items"] < REFILL_BATCH:
                rows = item_rows(2 * REFILL_BATCH + added, REFILL_BATCH)
                r, _ = await request(c, tally, "POST", f"/api/projects/{project}/items", {"items": rows})
                if r.status_code != 201:
                    raise RuntimeError(f"adding items failed: {r.status_code} {r.text[:300]}")
                added += len(r.json()["item_ids"])
            await asyncio.sleep(1)
    return added


async def restart_midway(server: ServerProcess, at: float) -> dict[str, float]:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    t0 = time.perf_counter()
    await asyncio.to_thread(server.restart)
    await asyncio.to_thread(server.wait_ready)
    return {"restart_s": round(time.perf_counter() - t0, 2)}


async def drive(
    server: ServerProcess, project: int, admin: str, tokens: dict[str, str], seconds: float, tally: Tally
) -> dict[str, Any]:
    t0 = time.monotonic()
    deadline = t0 + seconds
    tasks = [labeller(server.url, project, name, token, deadline, tally) for name, token in tokens.items()]
    *_, added, restart = await asyncio.gather(
        *tasks, refill(server.url, admin, project, deadline, tally), restart_midway(server, t0 + seconds / 2)
    )
    return {"wall_s": round(time.monotonic() - t0, 2), "items_added": added, **restart}


def setup(url: str, labellers: int) -> tuple[int, str, dict[str, str]]:
    sessions = open_db(url)
    with sessions() as s:
        admin = create_labeller(s, "admin", is_admin=True)[1]
        project = create_project(s, "load", "pairwise", overlap=3)
        tokens = {}
        for i in range(labellers):
            who, tokens[f"labeller{i:03d}"] = create_labeller(s, f"labeller{i:03d}")
            add_member(s, project, who)
        s.commit()
        add_items(s, project, item_rows(0, 2 * REFILL_BATCH))
        project_id = project.id
    sessions.kw["bind"].dispose()
    return project_id, admin, tokens


def check(url: str, tally: Tally) -> dict[str, Any]:
    """Read every label back: acknowledged ones stored once and unchanged, no double labels."""
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(Labeller.name, Label.submission_id, Label.item_id, Label.choice, Label.id).join(
                Labeller, Labeller.id == Label.labeller_id
            )
        ).all()
        doubles = conn.scalar(
            select(func.count()).select_from(
                select(Label.labeller_id, Label.item_id)
                .where(Label.retracted_at.is_(None))
                .group_by(Label.labeller_id, Label.item_id)
                .having(func.count() > 1)
                .subquery()
            )
        )
    engine.dispose()
    stored = Counter((name, sid) for name, sid, *_ in rows)
    by_key = {(name, sid): (item, choice, label_id) for name, sid, item, choice, label_id in rows}
    lost = [k for k in tally.acked if k not in by_key]
    changed = [k for k, v in tally.acked.items() if k in by_key and by_key[k] != v]
    return {
        "labels_stored": len(rows),
        "labels_acknowledged": len(tally.acked),
        "lost": len(lost),
        "changed": len(changed),
        "stored_more_than_once": sum(n > 1 for n in stored.values()),
        "two_active_labels_on_one_item": doubles,
        "stored_unacknowledged": sum(k not in tally.acked for k in by_key),
        "examples": [str(k) for k in (lost + changed)[:5]],
    }


def cpu_isa() -> str:
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if flags and model:
                break
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    return f"{model}; {os.cpu_count()} cores; " + (", ".join(x for x in wanted if x in flags) or "no AVX2")


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return (head.stdout.strip() or "unknown") + ("+dirty" if dirty else "")


def percentile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else (xs or [0.0])[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300, help="how long the labellers label (default 300)")
    ap.add_argument("--labellers", type=int, default=200)
    ap.add_argument(
        "--db",
        default=os.environ.get("FEEDBACKRL_TEST_PG_URL"),
        help="PostgreSQL URL whose server hosts the throwaway database (default $FEEDBACKRL_TEST_PG_URL)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if not args.db or not args.db.startswith(("postgresql", "postgres:")):
        print("error: give a PostgreSQL URL with --db or FEEDBACKRL_TEST_PG_URL", file=sys.stderr)
        return 2
    admin_engine = create_engine(make_url(args.db).set(database="postgres"), isolation_level="AUTOCOMMIT")
    name = f"feedbackrl_bench_{uuid.uuid4().hex[:10]}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(args.db).set(database=name).render_as_string(hide_password=False)
    try:
        project, admin, tokens = setup(url, args.labellers)
        tally = Tally()
        with ServerProcess(url) as server:
            run = asyncio.run(drive(server, project, admin, tokens, args.seconds, tally))
        verdict = check(url, tally)
    finally:
        with admin_engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin_engine.dispose()
    ms = tally.submit_ms
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "machine": cpu_isa(),
        "python": platform.python_version(),
        "command": " ".join(["python", "benchmarks/bench_labelling.py", *sys.argv[1:]]),
        "labellers": args.labellers,
        "seconds": args.seconds,
        "connections": pool_connections(),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        **run,
        "labels_per_s": round(len(tally.acked) / run["wall_s"], 1),
        "submit_ms_p50": round(percentile(ms, 50), 1),
        "submit_ms_p99": round(percentile(ms, 99), 1),
        "submit_ms_max": round(max(ms, default=0.0), 1),
        "replays": tally.replays,
        "bad_replays": tally.bad_replays[:5],
        "empty_queue_answers": tally.empty_queue,
        "errors": dict(sorted(tally.errors.items())),
        **verdict,
    }
    ok = bool(tally.acked) and not (
        verdict["lost"]
        or verdict["changed"]
        or verdict["stored_more_than_once"]
        or verdict["two_active_labels_on_one_item"]
        or tally.bad_replays
    )
    result["ok"] = ok
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['date']}  commit {result['commit']}  {result['machine']}")
    print(f"{args.labellers} labellers, {run['wall_s']} s, server restarted once ({run['restart_s']} s to answer)")
    print(
        f"labels: {len(tally.acked)} acknowledged ({result['labels_per_s']}/s), {verdict['labels_stored']} stored, "
        f"{verdict['lost']} lost, {verdict['stored_more_than_once']} duplicated, {verdict['changed']} changed, "
        f"{verdict['stored_unacknowledged']} stored unacknowledged; {tally.replays} replays, "
        f"{len(tally.bad_replays)} wrong"
    )
    print(
        f"submit latency: p50 {result['submit_ms_p50']} ms, p99 {result['submit_ms_p99']} ms, "
        f"max {result['submit_ms_max']} ms"
    )
    print(f"errors by kind (all retried): {result['errors'] or 'none'}")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
