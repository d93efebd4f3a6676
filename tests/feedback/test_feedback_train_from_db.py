"""`feedbackrl train` reading preference pairs straight from a labelling database (`prefs.db` +
`prefs.project`), on SQLite and PostgreSQL, and the errors that name what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import pair_rows
from typer.testing import CliRunner

from feedbackrl.cli import app
from feedbackrl.config import ConfigError, load_config
from feedbackrl.feedback import labels as L
from feedbackrl.feedback.export import display_url, read_pairs
from feedbackrl.feedback.items import add_items
from feedbackrl.feedback.store import FeedbackError, add_member, create_labeller, create_project

RECIPES = Path(__file__).parent.parent.parent / "recipes"
TOY = ["sft.steps=0", "task.heldout_size=8", "train.threads=1", "algo.batch_size=8", "prefs.heldout_prompts=4"]
runner = CliRunner()


def labelled_project(sessions, name: str = "rev", n: int = 20) -> list[int]:
    """Project `name` with n reversal items; label i picks responses[i % 2]; item 0 is skipped, item 1
    labelled then undone (neither gives a pair). -> the label ids that do give pairs, oldest first."""
    with sessions() as s:
        project = create_project(s, name, "pairwise")
        who, _ = create_labeller(s, "ann")
        add_member(s, project, who)
        s.commit()
        words = [f"ab{c}d{c}" for c in "cdefghijklmnopqrstuvwxyz"[:n]]
        rows = [{"prompt": f"{w}=", "responses": [w[::-1], w]} for w in words]
        ids = add_items(s, project, rows)
        kept = []
        for i, item in enumerate(ids):
            choice = "skip" if i == 0 else "ab"[i % 2]
            label, _ = L.submit(s, who, project, L.Submission(f"s{i}", item, choice))
            if i == 1:
                L.undo(s, who, project, label["id"])
            elif i > 1:
                kept.append(label["id"])
        return kept


def test_read_pairs_returns_every_preference_once_oldest_first(sessions, db_url):
    kept = labelled_project(sessions)
    rows = read_pairs(db_url, "rev")
    assert [r["label_id"] for r in rows] == kept and len(kept) == 18
    # item i is the word ab{c}d{c} with c = "cde..."[i]; even i chose "a" (the reversal), odd i "b" (the copy)
    assert (rows[0]["prompt"], rows[0]["chosen"], rows[0]["rejected"]) == ("abede=", "edeba", "abede")  # i = 2
    assert (rows[1]["prompt"], rows[1]["chosen"], rows[1]["rejected"]) == ("abfdf=", "abfdf", "fdfba")  # i = 3


def test_train_reward_model_from_the_database(sessions, db_url, tmp_path):
    kept = labelled_project(sessions)
    args = ["train", str(RECIPES / "reward_model.toml"), "--out", str(tmp_path / "rm")]
    for item in [*TOY, f"prefs.db={json.dumps(db_url)}", "prefs.project=rev"]:
        args += ["--set", item]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    prefs = json.loads((tmp_path / "rm" / "report.json").read_text())["prefs"]
    # 18 pairs; the held-out split is the newest min(4, 18 // 5) = 3
    assert (prefs["train_items"], prefs["heldout_items"]) == (15, 3)
    assert prefs["source"] == f"project 'rev' in {display_url(db_url)}"
    assert len(kept) == 18 and (tmp_path / "rm" / "reward_model" / "reward_model.json").is_file()


def test_unknown_and_empty_projects_are_named(sessions, db_url):
    labelled_project(sessions)
    with sessions() as s:
        add_items(s, create_project(s, "fresh", "pairwise"), pair_rows(3))
    with pytest.raises(FeedbackError, match=r"no project named 'nope'; projects: fresh, rev"):
        read_pairs(db_url, "nope")
    with pytest.raises(FeedbackError, match=r"project 'fresh' .* no preference pairs yet \(3 items, 0 active labels"):
        read_pairs(db_url, "fresh")


def test_bad_urls_name_the_problem(tmp_path):
    with pytest.raises(FeedbackError, match=r"prefs.db '://x' is not a database URL"):
        read_pairs("://x", "p")
    with pytest.raises(FeedbackError, match=r"prefs.db 'postgresql://me@host:port/db' is not a database URL"):
        read_pairs("postgresql://me@host:port/db", "p")
    with pytest.raises(FeedbackError, match=r"prefs.db nosuch://x/y: Can't load plugin: sqlalchemy.dialects:nosuch"):
        read_pairs("nosuch://x/y", "p")
    with pytest.raises(FeedbackError, match=f"no SQLite file at '{tmp_path}/missing.db'"):
        read_pairs(f"sqlite:///{tmp_path}/missing.db", "p")
    assert not (tmp_path / "missing.db").exists()  # reading never creates a database
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(FeedbackError, match="is not a labelling database"):
        read_pairs(str(tmp_path / "empty.db"), "p")
    assert display_url("postgresql://me:secret@host/db") == "postgresql+psycopg://me:***@host/db"


def test_cli_reports_a_database_error_without_a_traceback(tmp_path):
    result = runner.invoke(app, ["train", str(RECIPES / "reward_model.toml"), "--out", str(tmp_path / "o"),
                                 "--set", f"prefs.db='{tmp_path}/missing.db'", "--set", "prefs.project=p",
                                 "--set", "train.threads=1", "--set", "sft.steps=0"])
    assert result.exit_code == 2 and f"no SQLite file at '{tmp_path}/missing.db'" in result.output


@pytest.mark.parametrize("overrides, message", [
    (["prefs.db=x.db"], "prefs.db and prefs.project go together"),
    (["prefs.project=p"], "prefs.db and prefs.project go together"),
    (["prefs.db=x.db", "prefs.project=p", "prefs.path=a.jsonl"], "instead of prefs.path"),
])
def test_config_checks_db_and_project_together(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(RECIPES / "reward_model.toml", overrides)
