"""The connection pool: sized by --connections / FEEDBACKRL_DB_CONNECTIONS, matched by the request
threads, and a request that gets no connection is a 503 that stored nothing."""

from __future__ import annotations

import pytest
from conftest import auth, count_rows, make_world
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from feedbackrl.feedback.app import create_app, request_threads
from feedbackrl.feedback.store import CONNECTIONS_ENV, FeedbackError, make_engine, pool_connections


@pytest.mark.parametrize(("env", "expected"), [(None, 40), ("8", 8), (" 200 ", 200)])
def test_pool_size_comes_from_the_environment(monkeypatch, tmp_path, env, expected):
    if env is None:
        monkeypatch.delenv(CONNECTIONS_ENV, raising=False)
    else:
        monkeypatch.setenv(CONNECTIONS_ENV, env)
    engine = make_engine(str(tmp_path / "f.db"))
    assert pool_connections() == expected and engine.pool.size() == expected
    assert request_threads(sessionmaker(engine)) == expected
    engine.dispose()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ("x", "'x' is not a whole number"),
        ("-3", "is not a whole number"),
        ("0", "must be in 1..1000"),
        ("1001", "must be in 1..1000"),
    ],
)
def test_a_bad_pool_size_is_refused_naming_the_variable(monkeypatch, env, message):
    monkeypatch.setenv(CONNECTIONS_ENV, env)
    with pytest.raises(FeedbackError, match=message) as e:
        pool_connections()
    assert CONNECTIONS_ENV in str(e.value)


def test_no_free_connection_is_a_503_that_stores_nothing(sessions, db_url):
    w = make_world(sessions)
    engine = create_engine(sessions.kw["bind"].url, pool_size=1, max_overflow=0, pool_timeout=0.05)
    held = engine.connect()  # the only connection: every request waits out the pool timeout
    try:
        with TestClient(create_app(sessions=sessionmaker(engine))) as c:
            r = c.post(
                f"/api/projects/{w.p1}/labels",
                headers=auth(w.alice),
                json={"submission_id": "s1", "item_id": w.items1[0], "choice": "a"},
            )
    finally:
        held.close()
        engine.dispose()
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert "nothing stored; retry" in r.json()["error"]
    assert count_rows(sessions)["labels"] == 0
