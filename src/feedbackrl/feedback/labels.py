"""The labelling queue and the label rules: next item, submit, undo, progress, agreement.

Label values by project kind (indices refer to the item's stored `responses`):

- pairwise:      choice "a" (responses[0] is better), "b", "tie" or "skip"
- ranking:       choice "ranked" with `ranking` = all response indices best first, or "skip"
- accept_reject: choice "accept", "reject" or "skip"

Submissions are idempotent: the client picks a `submission_id` per intended label (the web page
embeds one in each form it renders) and a retry with the same id returns the stored label instead
of adding another. A skip takes the item out of this labeller's queue but does not count towards
the project's `overlap` (labels wanted per item).

Agreement, for one labeller: over every (own label, other labeller's label) pair on the same
item, skips excluded, the mean similarity: 1/0 for equal choices, and for rankings the fraction
of response pairs that both rankings order the same way (a tie equals only a tie).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import combinations
from typing import Any

from sqlalchemy import BigInteger, and_, cast, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from feedbackrl.feedback.store import Conflict, FeedbackError, Item, Label, Labeller, NotFound, Project, check_text

CHOICES = {"pairwise": ("a", "b", "tie", "skip"), "ranking": ("ranked", "skip"),
           "accept_reject": ("accept", "reject", "skip")}
REASON_MAX = 2000
SUBMISSION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(frozen=True)
class Submission:
    """What a labeller sends. `ranking` only for ranking items; `reason` is optional free text."""

    submission_id: str
    item_id: int
    choice: str
    ranking: list[int] | None = None
    reason: str | None = None


def check_submission(sub: Submission, project: Project, item: Item) -> None:
    """Raise FeedbackError naming the field and what is allowed, for a label of the wrong shape."""
    if not SUBMISSION_ID.fullmatch(sub.submission_id):
        raise FeedbackError("submission_id must be 1-64 characters from A-Z a-z 0-9 _ . : -; "
                            f"got {sub.submission_id!r:.80}")
    allowed = CHOICES[project.kind]
    if sub.choice not in allowed:
        raise FeedbackError(f"item {item.id} is a {project.kind} item: choice must be one of "
                            f"{', '.join(allowed)}; got {sub.choice!r:.40}")
    if sub.reason is not None and len(sub.reason) > REASON_MAX:
        raise FeedbackError(f"reason is {len(sub.reason)} characters; at most {REASON_MAX} are allowed")
    k = len(item.responses)
    if sub.choice == "ranked":
        if sub.ranking is None or sorted(sub.ranking) != list(range(k)):
            raise FeedbackError(f"item {item.id} has {k} responses: ranking must list each index 0..{k - 1} "
                                f"once, best first; got {sub.ranking!r:.80}")
    elif sub.ranking is not None:
        raise FeedbackError(f"ranking is only for choice 'ranked' on ranking items; got choice {sub.choice!r}")


def label_dict(label: Label) -> dict[str, Any]:
    return {"id": label.id, "item_id": label.item_id, "submission_id": label.submission_id,
            "choice": label.choice, "ranking": label.ranking, "reason": label.reason,
            "undone": label.retracted_at is not None}


def _same(label: Label, sub: Submission) -> bool:
    return (label.item_id, label.choice, label.ranking, label.reason or None) == (
        sub.item_id, sub.choice, sub.ranking, sub.reason or None)


def _by_submission(s: Session, who: Labeller, submission_id: str) -> Label | None:
    return s.scalar(select(Label).where(Label.labeller_id == who.id, Label.submission_id == submission_id))


def _replay(existing: Label, sub: Submission) -> tuple[dict[str, Any], bool]:
    if not _same(existing, sub):
        raise Conflict(f"submission_id {sub.submission_id!r} was already used for a different label "
                       f"(label {existing.id}); use a new id for a new label")
    return label_dict(existing), False


def submit(s: Session, who: Labeller, project: Project, sub: Submission) -> tuple[dict[str, Any], bool]:
    """Store one label; -> (label, created). A replayed submission returns the stored label, created=False.

    Commits. On any error nothing is written.
    """
    for where, text in (("submission_id", sub.submission_id), ("choice", sub.choice), ("reason", sub.reason)):
        check_text(text, where)
    existing = _by_submission(s, who, sub.submission_id)
    if existing is not None:
        return _replay(existing, sub)
    item = s.get(Item, sub.item_id)
    if item is None or item.project_id != project.id:
        raise NotFound(f"item {sub.item_id} not found in project {project.id}")
    check_submission(sub, project, item)
    label = Label(project_id=project.id, item_id=item.id, labeller_id=who.id, submission_id=sub.submission_id,
                  choice=sub.choice, ranking=sub.ranking, reason=sub.reason or None)
    s.add(label)
    try:
        s.flush()  # the insert first: a replay or a second label on the item stops here, counting nothing
        if sub.choice != "skip":
            s.execute(update(Item).where(Item.id == item.id).values(labels_count=Item.labels_count + 1))
        s.commit()
    except IntegrityError:
        # Either a concurrent retry of this submission won the race, or the labeller already has an
        # active label on the item (e.g. from another tab). The unique constraints decide, not us.
        s.rollback()
        existing = _by_submission(s, who, sub.submission_id)
        if existing is not None:
            return _replay(existing, sub)
        raise Conflict(f"you already labelled item {item.id}; undo that label first to change it") from None
    return label_dict(label), True


def undo(s: Session, who: Labeller, project: Project, label_id: int | None = None) -> dict[str, Any] | None:
    """Undo `label_id` (or this labeller's latest active label in the project); idempotent. Commits.

    Returns the undone label, or None when there was nothing to undo.
    """
    query = select(Label).where(Label.labeller_id == who.id, Label.project_id == project.id)
    if label_id is not None:
        label = s.scalar(query.where(Label.id == label_id))
        if label is None:
            raise NotFound(f"label {label_id} not found among your labels in project {project.id}")
    else:
        label = s.scalar(query.where(Label.retracted_at.is_(None)).order_by(Label.id.desc()).limit(1))
        if label is None:
            return None
    if label.retracted_at is None:
        label.retracted_at = datetime.now(UTC)
        if label.choice != "skip":
            s.execute(update(Item).where(Item.id == label.item_id).values(labels_count=Item.labels_count - 1))
        s.commit()
    return label_dict(label)


def last_label(s: Session, who: Labeller, project: Project) -> Label | None:
    return s.scalar(select(Label).where(Label.labeller_id == who.id, Label.project_id == project.id,
                                        Label.retracted_at.is_(None)).order_by(Label.id.desc()).limit(1))


# --- the queue --------------------------------------------------------------------------------


def _open_items(who: Labeller, project: Project) -> Any:
    """Select of the items this labeller may label next: short of `overlap` and not labelled by them.

    Reads `Item.labels_count` (indexed with the project), so the cost follows the open items, not
    every label ever stored."""
    mine = select(Label.id).where(Label.item_id == Item.id, Label.labeller_id == who.id,
                                  Label.retracted_at.is_(None)).exists()
    return select(Item).where(Item.project_id == project.id, Item.labels_count < project.overlap, ~mine)


def next_item(s: Session, who: Labeller, project: Project, prefer: int | None = None) -> Item | None:
    """The next item for `who`: fewest labels first, then a per-labeller shuffle.

    The shuffle (a hash of item and labeller ids) keeps concurrent labellers off the same item
    without locks; `prefer` (e.g. the item just undone) wins when it is still open.
    """
    query = _open_items(who, project)
    if prefer is not None:
        item = s.scalar(query.where(Item.id == prefer))
        if item is not None:
            return item
    spread = (cast(Item.id, BigInteger) * 7919 + who.id * 104729) % 10007
    return s.scalar(query.order_by(Item.labels_count, spread, Item.id).limit(1))


def progress(s: Session, who: Labeller, project: Project) -> dict[str, Any]:
    """Counts for the labeller's progress bar, plus agreement with others on shared items."""
    query = _open_items(who, project)
    remaining = s.scalar(select(func.count()).select_from(query.subquery()))
    mine = s.execute(select(Label.choice, func.count()).where(
        Label.labeller_id == who.id, Label.project_id == project.id, Label.retracted_at.is_(None))
        .group_by(Label.choice)).all()
    done = sum(c for _, c in mine)
    skipped = sum(c for choice, c in mine if choice == "skip")
    items = s.scalar(select(func.count()).select_from(Item).where(Item.project_id == project.id))
    agreement, compared = agreement_of(s, who, project)
    return {"done": done, "skipped": skipped, "remaining": remaining, "total": items,
            "agreement": agreement, "agreement_pairs": compared}


def queue_status(s: Session, project: Project) -> dict[str, int]:
    """Project-wide counts for whoever refills the queue: items, items still short of `overlap`
    non-skip labels (open), active labels, and the highest label id (a cursor for `labelled_pairs`)."""
    open_items = s.scalar(select(func.count()).select_from(Item).where(Item.project_id == project.id,
                                                                       Item.labels_count < project.overlap))
    items = s.scalar(select(func.count()).select_from(Item).where(Item.project_id == project.id))
    labels, last_id = s.execute(select(func.count(), func.coalesce(func.max(Label.id), 0)).where(
        Label.project_id == project.id, Label.retracted_at.is_(None))).one()
    return {"items": items, "open_items": open_items, "labels": labels, "last_label_id": last_id}


def _similarity(x: Label, y: Label) -> float:
    if x.choice == "ranked" and y.choice == "ranked":
        pos_x = {r: i for i, r in enumerate(x.ranking or [])}
        pos_y = {r: i for i, r in enumerate(y.ranking or [])}
        pairs = list(combinations(sorted(pos_x), 2))
        same = sum((pos_x[i] < pos_x[j]) == (pos_y[i] < pos_y[j]) for i, j in pairs)
        return same / len(pairs) if pairs else 1.0
    return float(x.choice == y.choice)


def agreement_of(s: Session, who: Labeller, project: Project) -> tuple[float | None, int]:
    """-> (mean agreement with other labellers on shared items or None, number of label pairs compared)."""
    other = Label.__table__.alias("other")
    rows = s.execute(
        select(Label, other.c.choice, other.c.ranking)
        .join(other, and_(other.c.item_id == Label.item_id, other.c.labeller_id != Label.labeller_id))
        .where(Label.labeller_id == who.id, Label.project_id == project.id, Label.retracted_at.is_(None),
               Label.choice != "skip", other.c.retracted_at.is_(None), other.c.choice != "skip")).all()
    if not rows:
        return None, 0
    sims = [_similarity(mine, Label(choice=choice, ranking=ranking)) for mine, choice, ranking in rows]
    return sum(sims) / len(sims), len(sims)


def item_dict(item: Item, project: Project) -> dict[str, Any]:
    return {"id": item.id, "project_id": project.id, "kind": project.kind, "prompt": item.prompt,
            "responses": list(item.responses), "meta": item.meta or {}}
