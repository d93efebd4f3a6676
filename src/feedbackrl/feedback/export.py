"""Labels -> rows that `feedbackrl.data.preferences` loads (`load_preference_pairs`, `load_rankings`).

Every active (not undone) label becomes data; there is no majority vote, so when labellers
disagree both directions appear, each row naming its labeller. Skips and ties carry no
preference and are left out of pairs and rankings (the "labels" format keeps everything;
`labelled_pairs(..., ties=True)`, the online loop's export, keeps ties as rows marked "tie").

- pairs:    ``{"prompt", "chosen", "rejected", ...meta}`` from pairwise labels; from each ranking,
            every pair it implies (k*(k-1)/2, as in InstructGPT); from accept/reject labels, each
            accepted response against each rejected response to the same prompt.
- rankings: ``{"prompt", "responses": [best, ..., worst], ...meta}`` from rankings and from
            pairwise labels (k = 2).
- labels:   one row per label, raw: choice, ranking, reason, labeller, the item's texts.

`labelled_pairs` is the seam for an online reward-model loop: call it for the current pairs.
`read_pairs` opens a database by URL for `feedbackrl train` (`prefs.db` + `prefs.project`).
"""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session

from feedbackrl.feedback.labels import queue_status
from feedbackrl.feedback.store import (
    FeedbackError,
    Item,
    Label,
    Labeller,
    Project,
    get_project,
    make_engine,
    normalize_url,
)

Format = Literal["pairs", "rankings", "labels"]
FORMATS = ("pairs", "rankings", "labels")


def _active_labels(s: Session, project: Project, since_id: int = 0) -> list[tuple[Label, Item, str]]:
    rows = s.execute(select(Label, Item, Labeller.name).join(Item, Item.id == Label.item_id)
                     .join(Labeller, Labeller.id == Label.labeller_id)
                     .where(Label.project_id == project.id, Label.retracted_at.is_(None), Label.id > since_id)
                     .order_by(Label.id)).all()
    return [(label, item, name) for label, item, name in rows]


def _meta(project: Project, label: Label, item: Item, labeller: str) -> dict[str, Any]:
    return {"project": project.name, "kind": project.kind, "item_id": item.id, "label_id": label.id,
            "labeller": labeller, "reason": label.reason}


def _order(label: Label) -> list[int] | None:
    """Response indices best first, or None when the label states no preference."""
    if label.choice == "a":
        return [0, 1]
    if label.choice == "b":
        return [1, 0]
    if label.choice == "ranked":
        return list(label.ranking or [])
    return None


def labelled_pairs(s: Session, project: Project, since_id: int = 0, ties: bool = False) -> list[dict[str, Any]]:
    """Preference pairs from the project's active labels with id > `since_id`, oldest first.

    ties: also pairwise "tie" labels, as rows {"chosen": response a, "rejected": response b, "tie": true}
    (their order means nothing; `algos.reward_model.bradley_terry_loss` trains them with target 1/2)."""
    rows: list[dict[str, Any]] = []
    accepted: dict[str, list[tuple[Label, Item, str]]] = defaultdict(list)
    rejected: dict[str, list[tuple[Label, Item, str]]] = defaultdict(list)
    for label, item, name in _active_labels(s, project, since_id):
        if label.choice in ("accept", "reject"):
            (accepted if label.choice == "accept" else rejected)[item.prompt].append((label, item, name))
            continue
        if ties and label.choice == "tie":
            rows.append({"prompt": item.prompt, "chosen": item.responses[0], "rejected": item.responses[1],
                         "tie": True, **_meta(project, label, item, name)})
            continue
        order = _order(label)
        for better, worse in combinations(order or [], 2):
            rows.append({"prompt": item.prompt, "chosen": item.responses[better],
                         "rejected": item.responses[worse], **_meta(project, label, item, name)})
    for prompt, goods in accepted.items():
        for (la, ia, na), (lr, ir, nr) in ((g, b) for g in goods for b in rejected.get(prompt, [])):
            if ia.responses[0] != ir.responses[0]:
                rows.append({"prompt": prompt, "chosen": ia.responses[0], "rejected": ir.responses[0],
                             "project": project.name, "kind": project.kind, "item_id": [ia.id, ir.id],
                             "label_id": [la.id, lr.id], "labeller": [na, nr], "reason": [la.reason, lr.reason]})
    return rows


def labelled_rankings(s: Session, project: Project) -> list[dict[str, Any]]:
    rows = []
    for label, item, name in _active_labels(s, project):
        order = _order(label)
        if order:
            rows.append({"prompt": item.prompt, "responses": [item.responses[j] for j in order],
                         **_meta(project, label, item, name)})
    return rows


def raw_labels(s: Session, project: Project) -> list[dict[str, Any]]:
    return [{**_meta(project, label, item, name), "prompt": item.prompt, "responses": item.responses,
             "choice": label.choice, "ranking": label.ranking, "created_at": label.created_at.isoformat()}
            for label, item, name in _active_labels(s, project)]


def export_rows(s: Session, project: Project, fmt: Format = "pairs") -> list[dict[str, Any]]:
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    return {"pairs": labelled_pairs, "rankings": labelled_rankings, "labels": raw_labels}[fmt](s, project)


def display_url(db: str) -> str:
    """The database URL as it is safe to print and log: any password masked."""
    try:
        return make_url(normalize_url(db)).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return db


def read_pairs(db: str, project: str) -> list[dict[str, Any]]:
    """All preference pairs of `project` in the labelling database `db`, oldest label first.

    For `feedbackrl train` with `prefs.db`: nothing is migrated or created (a SQLite file that does
    not exist is an error, not a new empty database). Raises FeedbackError naming the problem: a
    malformed URL, a missing file, a database that cannot be reached or holds no labelling schema,
    an unknown project (listing the ones there are), or a project without a single preference yet.
    """
    shown = display_url(db)
    try:
        url = make_url(normalize_url(db))
    except (ArgumentError, ValueError) as e:
        raise FeedbackError(f"prefs.db {db!r} is not a database URL ({e}); use sqlite:///path/labels.db "
                            "or postgresql://user@host/db") from None
    if url.get_backend_name() == "sqlite" and not (url.database and Path(url.database).is_file()):
        raise FeedbackError(f"prefs.db {shown}: no SQLite file at {url.database!r}")
    try:
        engine = make_engine(db)
    except (ArgumentError, NoSuchModuleError) as e:
        raise FeedbackError(f"prefs.db {shown}: {e}") from None
    try:
        with Session(engine) as s:
            if not inspect(s.connection()).has_table("labels"):
                raise FeedbackError(f"prefs.db {shown} is not a labelling database (no labels table); "
                                    "make one with `feedbackrl label create-project --db ...`")
            p = get_project(s, project)
            rows = labelled_pairs(s, p)
            if not rows:
                status = queue_status(s, p)
                raise FeedbackError(f"project {project!r} in {shown} has no preference pairs yet ({status['items']} "
                                    f"items, {status['labels']} active labels, none stating a preference)")
            return rows
    except OperationalError as e:
        raise FeedbackError(f"cannot read prefs.db {shown}: {e.orig}") from None
    finally:
        engine.dispose()
