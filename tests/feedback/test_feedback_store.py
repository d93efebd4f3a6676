"""The store and the label rules, on SQLite and PostgreSQL: schema = migrations, hashed tokens,
idempotent submissions, undo, the queue, agreement worked by hand, export read back by the
preference loaders, item validation, and items sampled from a tiny policy."""

from __future__ import annotations

import subprocess
import sys

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from conftest import BACKENDS, count_rows, make_world, pair_rows
from sqlalchemy import select, text

from feedbackrl.data.preferences import load_preference_pairs, load_rankings
from feedbackrl.data.rows import write_jsonl
from feedbackrl.feedback import labels as L
from feedbackrl.feedback.export import export_rows, labelled_pairs
from feedbackrl.feedback.items import add_items, group_samples, sample_items
from feedbackrl.feedback.store import (
    Base,
    Conflict,
    FeedbackError,
    Item,
    Label,
    Labeller,
    NotFound,
    Project,
    authenticate,
    create_labeller,
    make_engine,
    rotate_token,
    upgrade,
)


def who(s, name: str) -> Labeller:
    return s.scalar(select(Labeller).where(Labeller.name == name))


def sub(n: int | str, item: int, choice: str, ranking=None, reason=None) -> L.Submission:
    return L.Submission(f"sub-{n}", item, choice, ranking, reason)


def test_migrated_schema_matches_the_models(sessions):
    with sessions() as s:
        diffs = compare_metadata(MigrationContext.configure(s.connection()), Base.metadata)
        version = s.scalar(text("SELECT version_num FROM alembic_version"))
    assert diffs == [] and version == "0003"


def test_tokens_are_stored_hashed_and_rotate(sessions):
    with sessions() as s:
        labeller, token = create_labeller(s, "alice")
        s.commit()
        dump = repr(s.execute(text("SELECT * FROM labellers")).all())
        assert token not in dump and len(labeller.token_hash) == 64
        assert authenticate(s, token).name == "alice"
        assert authenticate(s, token + "x") is None and authenticate(s, "") is None
        with pytest.raises(Conflict, match="already exists"):
            create_labeller(s, "alice")
        s.rollback()
        new = rotate_token(s, "alice")
        s.commit()
        assert authenticate(s, token) is None and authenticate(s, new).name == "alice"


def test_submissions_are_idempotent_and_one_active_label_per_item(sessions):
    w = make_world(sessions)
    with sessions() as s:
        alice, p1 = who(s, "alice"), s.get(Project, w.p1)
        first, created = L.submit(s, alice, p1, sub(1, w.items1[0], "a", reason="clearer"))
        again, created_again = L.submit(s, alice, p1, sub(1, w.items1[0], "a", reason="clearer"))
        assert created and not created_again and again == first
        with pytest.raises(Conflict, match="already used for a different label"):
            L.submit(s, alice, p1, sub(1, w.items1[0], "b"))
        with pytest.raises(Conflict, match="already labelled item"):
            L.submit(s, alice, p1, sub(2, w.items1[0], "b"))
        with pytest.raises(NotFound, match=f"item {w.items2[0]} not found in project {w.p1}"):
            L.submit(s, alice, p1, sub(3, w.items2[0], "a"))  # another project's item
    assert count_rows(sessions)["labels"] == 1


def test_a_retry_that_loses_the_insert_race_returns_the_stored_label(sessions, monkeypatch):
    """Two copies of one submission both pass the "seen it?" check; the unique constraint stops the
    second insert, which then answers with the first copy's label. The check is made blind here."""
    w = make_world(sessions)
    with sessions() as s:
        alice, p1 = who(s, "alice"), s.get(Project, w.p1)
        first, _ = L.submit(s, alice, p1, sub(1, w.items1[0], "a"))
        real, calls = L._by_submission, []
        monkeypatch.setattr(L, "_by_submission", lambda *a: calls.append(1) or (real(*a) if len(calls) > 1 else None))
        assert L.submit(s, alice, p1, sub(1, w.items1[0], "a")) == (first, False)
        assert len(calls) == 2  # blind check, then the lookup after the constraint fired
    assert count_rows(sessions)["labels"] == 1


def test_undo_returns_the_item_to_the_queue_and_is_idempotent(sessions):
    w = make_world(sessions)
    with sessions() as s:
        alice, p1 = who(s, "alice"), s.get(Project, w.p1)
        assert L.undo(s, alice, p1) is None  # nothing to undo yet
        L.submit(s, alice, p1, sub(1, w.items1[0], "a"))
        label, _ = L.submit(s, alice, p1, sub(2, w.items1[1], "b"))
        undone = L.undo(s, alice, p1, label["id"])
        assert undone["undone"] and undone["item_id"] == w.items1[1]
        assert L.undo(s, alice, p1, label["id"]) == undone  # a retried undo changes nothing
        assert L.last_label(s, alice, p1).item_id == w.items1[0]
        assert L.next_item(s, alice, p1, prefer=w.items1[1]).id == w.items1[1]
        L.submit(s, alice, p1, sub(3, w.items1[1], "a"))  # relabel after undo
        with pytest.raises(NotFound):
            L.undo(s, who(s, "bob"), p1, label["id"])  # not bob's label
        choices = s.execute(select(Label.choice, Label.retracted_at.is_(None)).order_by(Label.id)).all()
    assert [tuple(c) for c in choices] == [("a", True), ("b", False), ("a", True)]


def test_queue_honours_overlap_and_skips(sessions):
    w = make_world(sessions, rows=pair_rows(2), overlap=2)
    with sessions() as s:
        alice, bob, p1 = who(s, "alice"), who(s, "bob"), s.get(Project, w.p1)
        a, b = w.items1
        L.submit(s, alice, p1, sub(1, a, "a"))
        L.submit(s, alice, p1, sub(2, b, "skip"))
        assert L.next_item(s, alice, p1) is None  # alice has seen both
        assert L.progress(s, alice, p1) | {"agreement": 0} == {
            "done": 2, "skipped": 1, "remaining": 0, "total": 2, "agreement": 0, "agreement_pairs": 0}
        # bob: `a` has 1 of 2 labels, `b` 0 (skips do not count): fewest labels first -> b
        assert L.next_item(s, bob, p1).id == b
        L.submit(s, bob, p1, sub(3, b, "a"))
        L.submit(s, bob, p1, sub(4, a, "a"))
        assert L.progress(s, bob, p1)["remaining"] == 0


def test_agreement_worked_by_hand(sessions):
    # pairwise: alice a,a,b ; bob a,b,b -> agree on items 0 and 2 -> 2/3
    w = make_world(sessions, rows=pair_rows(3))
    with sessions() as s:
        alice, bob, p1 = who(s, "alice"), who(s, "bob"), s.get(Project, w.p1)
        for n, (item, x, y) in enumerate(zip(w.items1, "aab", "abb", strict=True)):
            L.submit(s, alice, p1, sub(f"a{n}", item, x))
            L.submit(s, bob, p1, sub(f"b{n}", item, y))
        assert L.agreement_of(s, alice, p1) == (pytest.approx(2 / 3), 3)
        assert L.agreement_of(s, who(s, "mallory"), s.get(Project, w.p2)) == (None, 0)


def test_ranking_agreement_counts_concordant_pairs(sessions):
    # alice 0>1>2, bob 0>2>1: pairs (0,1) and (0,2) ordered alike, (1,2) not -> 2/3
    w = make_world(sessions, "ranking", rows=[{"prompt": "p", "responses": ["x", "y", "z"]}])
    with sessions() as s:
        p1 = s.get(Project, w.p1)
        L.submit(s, who(s, "alice"), p1, sub(1, w.items1[0], "ranked", [0, 1, 2]))
        L.submit(s, who(s, "bob"), p1, sub(2, w.items1[0], "ranked", [0, 2, 1]))
        assert L.agreement_of(s, who(s, "alice"), p1) == (pytest.approx(2 / 3), 1)


@pytest.mark.parametrize(("choice", "ranking", "message"), [
    ("accept", None, "choice must be one of a, b, tie, skip; got 'accept'"),
    ("a", [0, 1], "ranking is only for choice 'ranked'"),
    ("ranked", None, "choice must be one of a, b, tie, skip; got 'ranked'"),
], ids=["accept-on-pairwise", "ranking-on-pairwise", "ranked-on-pairwise"])
def test_labels_of_the_wrong_kind_are_refused(sessions, choice, ranking, message):
    w = make_world(sessions)
    with sessions() as s, pytest.raises(FeedbackError, match=message.replace("(", r"\(").replace(")", r"\)")):
        L.submit(s, who(s, "alice"), s.get(Project, w.p1), sub(1, w.items1[0], choice, ranking))
    assert count_rows(sessions)["labels"] == 0


def test_export_pairs_and_rankings_load_back(sessions, tmp_path):
    w = make_world(sessions, rows=pair_rows(4))
    with sessions() as s:
        alice, bob, p1 = who(s, "alice"), who(s, "bob"), s.get(Project, w.p1)
        for n, choice in enumerate(["a", "b", "tie", "skip"]):
            L.submit(s, alice, p1, sub(f"a{n}", w.items1[n], choice, reason="why" if n == 0 else None))
        L.submit(s, bob, p1, sub("b0", w.items1[0], "b"))  # disagrees with alice: both rows kept
        write_jsonl(export_rows(s, p1, "pairs"), tmp_path / "pairs.jsonl")
        write_jsonl(export_rows(s, p1, "rankings"), tmp_path / "rankings.jsonl")
        raw = export_rows(s, p1, "labels")
    pairs, dropped = load_preference_pairs(tmp_path / "pairs.jsonl")
    assert dropped == [] and [(p.prompt, p.chosen, p.rejected, p.meta["labeller"]) for p in pairs] == [
        ("prompt 0", "good 0", "bad 0", "alice"), ("prompt 1", "bad 1", "good 1", "alice"),
        ("prompt 0", "bad 0", "good 0", "bob")]
    assert pairs[0].meta["reason"] == "why" and pairs[0].meta["item_id"] == w.items1[0]
    rankings, _ = load_rankings(tmp_path / "rankings.jsonl")
    assert [r.responses for r in rankings] == [["good 0", "bad 0"], ["bad 1", "good 1"], ["bad 0", "good 0"]]
    assert [r["choice"] for r in raw] == ["a", "b", "tie", "skip", "b"]


def test_ranking_and_accept_reject_exports(sessions):
    w = make_world(sessions, "ranking", rows=[{"prompt": "p", "responses": ["x", "y", "z"]}])
    with sessions() as s:
        p1 = s.get(Project, w.p1)
        L.submit(s, who(s, "alice"), p1, sub(1, w.items1[0], "ranked", [2, 0, 1]))
        pairs, _ = load_preference_pairs(labelled_pairs(s, p1))
    # z > x > y implies z>x, z>y, x>y
    assert [(p.chosen, p.rejected) for p in pairs] == [("z", "x"), ("z", "y"), ("x", "y")]

    with sessions() as s:
        p3 = s.get(Project, w.p2)  # reuse mallory's project as accept/reject
        p3.kind = "accept_reject"
        s.commit()
        ids = add_items(s, p3, [{"prompt": "q", "response": r} for r in ("r1", "r2", "r3")]
                        + [{"prompt": "other", "response": "r4"}])
        mallory = who(s, "mallory")
        for n, (item, choice) in enumerate(zip(ids, ["accept", "reject", "reject", "accept"], strict=True)):
            L.submit(s, mallory, p3, sub(n, item, choice))
        pairs, _ = load_preference_pairs(labelled_pairs(s, p3))
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [("q", "r1", "r2"), ("q", "r1", "r3")]


def test_bad_item_rows_import_nothing(sessions):
    w = make_world(sessions)
    before = count_rows(sessions)
    rows = [{"prompt": "ok", "responses": ["a", "b"]}, {"prompt": "p", "responses": ["same", "same"]},
            {"responses": ["a", "b"]}, {"prompt": "p", "responses": ["a", "b", "c"]}, "not a row"]
    with sessions() as s, pytest.raises(FeedbackError) as e:
        add_items(s, s.get(Project, w.p1), rows)
    assert str(e.value).splitlines() == [
        "4 bad item row(s), nothing imported:",
        "  row 1: identical responses: there is nothing to compare",
        "  row 2: 'prompt' must be non-empty text (columns: responses)",
        "  row 3: a pairwise item needs exactly 2 responses, got 3",
        "  row 4: expected an object with prompt and responses, got str"]
    assert count_rows(sessions) == before


def test_group_samples_by_kind():
    samples = ["x", "y", "x", "z", " ", "w"]  # distinct non-empty: x y z w
    assert [r["responses"] for r in group_samples("p", samples, "pairwise", {})] == [["x", "y"], ["z", "w"]]
    assert [r["responses"] for r in group_samples("p", samples, "ranking", {})] == [["x", "y", "z", "w"]]
    assert [r["responses"] for r in group_samples("p", samples, "accept_reject", {"m": 1})] == [
        ["x"], ["y"], ["z"], ["w"]]
    assert group_samples("p", ["x", "x"], "pairwise", {}) == []


def test_sample_items_from_a_tiny_policy(tiny_model_dir):
    rows = sample_items(str(tiny_model_dir), ["12+3=", "4+5="], samples=3, kind="ranking", max_new_tokens=6,
                        temperature=1.0, seed=0)
    assert [r["prompt"] for r in rows] == ["12+3=", "4+5="]
    assert all(2 <= len(r["responses"]) <= 3 and r["source"] == "fill" for r in rows)
    assert rows == sample_items(str(tiny_model_dir), ["12+3=", "4+5="], 3, "ranking", 6, 1.0, 0)  # seeded


def test_core_import_does_not_load_the_web_stack():
    code = ("import sys, feedbackrl, feedbackrl.cli, feedbackrl.data.preferences; "
            "bad = [m for m in ('fastapi', 'sqlalchemy', 'alembic', 'uvicorn', 'starlette') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_item_label_counts_follow_submits_skips_replays_and_undo(sessions):
    """labels_count = active non-skip labels: what the queue compares with `overlap`."""
    w = make_world(sessions)  # overlap 2
    first, second = w.items1[:2]
    with sessions() as s:
        alice, bob, p1 = who(s, "alice"), who(s, "bob"), s.get(Project, w.p1)
        L.submit(s, alice, p1, sub("a1", first, "a"))
        L.submit(s, alice, p1, sub("a1", first, "a"))  # a replay counts nothing
        L.submit(s, bob, p1, sub("b1", first, "tie"))
        L.submit(s, alice, p1, sub("a2", second, "skip"))  # a skip does not count
        with pytest.raises(Conflict):
            L.submit(s, bob, p1, sub("b2", first, "b"))  # refused: counts nothing
        counts = dict(s.execute(select(Item.id, Item.labels_count)).all())
        assert (counts[first], counts[second]) == (2, 0)
        assert L.queue_status(s, p1)["open_items"] == len(w.items1) - 1  # first is full (overlap 2)
        L.undo(s, bob, p1)
        L.undo(s, alice, p1)  # undoes the skip on `second`: still 0
        L.undo(s, bob, p1)  # nothing left for bob: no change
        counts = dict(s.execute(select(Item.id, Item.labels_count)).all())
        assert (counts[first], counts[second]) == (1, 0)


@pytest.fixture(params=BACKENDS)
def fresh_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A database with no schema at all (the shared PostgreSQL one is already at head)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    return request.getfixturevalue("pg_factory")()


def test_migration_0002_counts_the_labels_already_stored(fresh_url):
    engine = make_engine(fresh_url)
    upgrade(engine, "0001")
    now = "2026-01-01 00:00:00+00:00"
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO projects VALUES (1, 'p', 'pairwise', 3, '', '{now}')"))
        for who in (1, 2, 3):
            conn.execute(text(f"INSERT INTO labellers VALUES ({who}, 'l{who}', '{who:064d}', false, '{now}')"))
        for item in (1, 2, 3):
            conn.execute(text(f"""INSERT INTO items VALUES ({item}, 1, 'q', '["x", "y"]', '{{}}', '{now}')"""))
        # item 1: two labels and an undone one; item 2: a skip only; item 3: nothing
        for n, (item, who, choice, undone) in enumerate([(1, 1, "a", None), (1, 2, "b", None), (1, 3, "a", now),
                                                         (2, 1, "skip", None)]):
            undone_sql = f"'{undone}'" if undone else "NULL"
            conn.execute(text(f"INSERT INTO labels VALUES ({n + 1}, 1, {item}, {who}, 's{n}', '{choice}', NULL, NULL, "
                              f"'{now}', {undone_sql})"))
    upgrade(engine)
    with engine.connect() as conn:
        assert dict(conn.execute(text("SELECT id, labels_count FROM items")).all()) == {1: 2, 2: 0, 3: 0}
    engine.dispose()
