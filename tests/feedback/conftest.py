"""Shared fixtures for the labelling app: databases (SQLite file, real PostgreSQL), a small world
of projects/labellers/items, and a real uvicorn server on 127.0.0.1.

PostgreSQL cases run against the server named by FEEDBACKRL_TEST_PG_URL (`.ci/run` starts one);
without it they are skipped with that reason, and the SQLite cases still run.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("fastapi", reason="the feedback extra is not installed: pip install -e '.[feedback]'")

from sqlalchemy import create_engine, inspect, make_url, text  # noqa: E402
from sqlalchemy.orm import Session, sessionmaker  # noqa: E402

from feedbackrl.feedback.items import add_items  # noqa: E402
from feedbackrl.feedback.store import add_member, create_labeller, create_project, open_db  # noqa: E402

PG_URL = os.environ.get("FEEDBACKRL_TEST_PG_URL")
NO_PG = "FEEDBACKRL_TEST_PG_URL is unset: no PostgreSQL server to test against (.ci/run starts one)"
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(not PG_URL, reason=NO_PG))]
TABLES = "labels, memberships, clips, items, labellers, projects"


def _admin_engine():
    return create_engine(make_url(PG_URL).set(database="postgres"), isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def pg_factory() -> Iterator:
    """Creates throwaway PostgreSQL databases (unique names: other runs may share the server)."""
    created: list[str] = []
    engine = _admin_engine()

    def new() -> str:
        name = f"feedbackrl_t_{uuid.uuid4().hex[:12]}"
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        created.append(name)
        return make_url(PG_URL).set(database=name).render_as_string(hide_password=False)

    yield new
    with engine.connect() as conn:
        for name in created:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


@pytest.fixture(scope="session")
def pg_shared(pg_factory) -> str:
    return pg_factory()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A database with no rows: a new SQLite file, or the session's PostgreSQL database emptied."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'feedback.db'}"
    url = request.getfixturevalue("pg_shared")
    engine = create_engine(url)
    with engine.begin() as conn:
        if inspect(conn).has_table("labels"):
            conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
    engine.dispose()
    return url


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    factory = open_db(db_url)
    yield factory
    factory.kw["bind"].dispose()


def count_rows(sessions: sessionmaker[Session]) -> dict[str, int]:
    with sessions() as s:
        return {t: s.scalar(text(f"SELECT count(*) FROM {t}")) for t in TABLES.split(", ")}


@dataclass
class World:
    """Two projects; alice and bob label `p1`, mallory labels only `p2`."""

    admin: str
    alice: str
    bob: str
    mallory: str
    p1: int
    p2: int
    items1: list[int]
    items2: list[int]


def pair_rows(n: int, tag: str = "") -> list[dict]:
    return [{"prompt": f"{tag}prompt {i}", "responses": [f"{tag}good {i}", f"{tag}bad {i}"], "n": i} for i in range(n)]


def make_world(sessions: sessionmaker[Session], kind: str = "pairwise", rows: list[dict] | None = None,
               overlap: int = 2) -> World:
    with sessions() as s:
        admin = create_labeller(s, "admin", is_admin=True)[1]
        p1 = create_project(s, "p1", kind, overlap=overlap)
        p2 = create_project(s, "p2", "pairwise")
        tokens = {}
        for name, project in (("alice", p1), ("bob", p1), ("mallory", p2)):
            who, tokens[name] = create_labeller(s, name)
            add_member(s, project, who)
        s.commit()
        items1 = add_items(s, p1, rows if rows is not None else pair_rows(4))
        items2 = add_items(s, p2, pair_rows(2, "secret "))
        return World(admin, tokens["alice"], tokens["bob"], tokens["mallory"], p1.id, p2.id, items1, items2)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class LiveServer:
    """uvicorn serving `app` on 127.0.0.1 (ephemeral port) in a background thread."""

    def __init__(self, app) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", limit_concurrency=200))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start within 20 s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
