"""People as an audit channel: each audit sample goes to an accept/reject project in the labelling app
while training runs; the labels that come back are the audit's verdicts (accept = 1, reject = 0).

`monitors.audit.people` in a recipe (config.PeopleAuditConfig). The loop serves the app on loopback
(uvicorn, in this process) on `db` (default OUT/audit_labels.db), makes an admin token in the
database (as `feedbackrl label admin-token` does) and creates the project; people label at the
page with their own tokens (`feedbackrl label add-labeller`, then invite them). With
`simulated = N`, N simulated labellers (the task's hidden gold check with Bradley-Terry noise,
`data/labeller.py`) label through the same API in background threads, as the tests and the
planted-hacks benchmark do.

A sample's verdicts are read back (`GET /labels`) once every item has `overlap` answers (a skip
counts as an answer, and an item only skipped drops out of the sample); with `wait_s` the step that
posted a sample waits up to that long for its labels (later steps do not wait), else they are
logged on the step they arrive. Each item's verdict is the
mean of its accept/reject labels; the audit's own agreement is the share of pairs of labels on
one item that agree. Items carry only the prompt and the completion: the labellers never see the
training reward. An empty completion is not posted (the app refuses one): its verdict is a reject.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedbackrl.config import ConfigError, PeopleAuditConfig
from feedbackrl.data.labeller import GoldScore, SimulatedLabeller
from feedbackrl.monitors.audit import AuditBatch, AuditChannel
from feedbackrl.rewards.verdict import Problem

POLL_S = 0.1  # seconds between label reads while a step waits


@dataclass
class _Sample:
    step: int
    items: list[int | None]  # item ids, in sample order; None: an empty completion, rejected without asking
    proxy: list[float]


@dataclass
class PeopleAudit(AuditChannel):
    """The labelling app as an audit. `api` is an `AdminApi` whose `project` is an accept/reject project;
    `problems` is shared with simulated labellers (prompt -> problem, so they know the gold answer)."""

    api: Any
    overlap: int = 1
    wait_s: float = 0.0
    problems: dict[str, Problem] = field(default_factory=dict)
    workers: list[Any] = field(default_factory=list)  # HttpLabeller threads, checked while waiting
    on_close: list[Any] = field(default_factory=list)  # callables run by close()
    name: str = "people"
    _pending: list[_Sample] = field(default_factory=list)
    _posted: bool = False  # a sample went out since the last collect: only then may collect wait

    def post(self, step: int, problems: list[Problem], texts: list[str], rewards: list[float]) -> None:
        for p in problems:
            self.problems.setdefault(p.prompt, p)
        asked = [i for i, t in enumerate(texts) if t.strip()]  # the app refuses an empty response
        rows = [{"prompt": problems[i].prompt, "responses": [texts[i]], "meta": {"audit_step": step}} for i in asked]
        ids = iter(self.api.add_items(rows) if rows else [])
        items = [next(ids) if t.strip() else None for t in texts]
        self._pending.append(_Sample(step, items, list(rewards)))
        self._posted = True

    def collect(self) -> list[AuditBatch]:
        if not self._pending:
            return []
        deadline = time.monotonic() + (self.wait_s if self._posted else 0.0)  # a step waits for its own sample
        self._posted = False
        while True:
            done = self._ready(self._labels())
            if done or time.monotonic() >= deadline:
                return done
            for w in self.workers:
                w.check()
            time.sleep(POLL_S)

    def _labels(self) -> dict[int, list[str]]:
        by_item: dict[int, list[str]] = {}
        for label in self.api.call("GET", f"/api/projects/{self.api.project}/labels"):
            if not label["undone"]:
                by_item.setdefault(label["item_id"], []).append(label["choice"])
        return by_item

    def _ready(self, by_item: dict[int, list[str]]) -> list[AuditBatch]:
        """The pending samples whose every item has `overlap` answers, as batches; they leave the queue."""
        out, keep = [], []
        for sample in self._pending:
            if any(i is not None and len(by_item.get(i, [])) < self.overlap for i in sample.items):
                keep.append(sample)
                continue
            proxy, verdicts, agree, pairs = [], [], 0, 0
            for item, reward in zip(sample.items, sample.proxy, strict=True):
                if item is None:  # an empty completion: rejected, no labels to agree on
                    proxy.append(reward)
                    verdicts.append(0.0)
                    continue
                votes = [c == "accept" for c in by_item[item] if c in ("accept", "reject")]
                if not votes:
                    continue  # only skipped
                proxy.append(reward)
                verdicts.append(sum(votes) / len(votes))
                yes = sum(votes)
                agree += yes * (yes - 1) // 2 + (len(votes) - yes) * (len(votes) - yes - 1) // 2
                pairs += len(votes) * (len(votes) - 1) // 2
            out.append(AuditBatch(sample.step, proxy, verdicts, agree / pairs if pairs else None))
        self._pending = keep
        return out

    def close(self) -> None:
        for w in self.workers:
            w.stop.set()
        for w in self.workers:
            w.join(timeout=10)
        for f in self.on_close:
            f()
        self.on_close.clear()


def start_people_audit(cfg: PeopleAuditConfig, out_dir: Path, gold: GoldScore | None, seed: int) -> PeopleAudit:
    """Serve the labelling app, create the accept/reject project (and the simulated labellers) -> the channel."""
    try:
        from feedbackrl.feedback.app import create_app
        from feedbackrl.feedback.client import AdminApi, HttpLabeller
        from feedbackrl.feedback.server import LiveServer
        from feedbackrl.feedback.store import create_labeller, open_db
    except ImportError as e:
        raise ConfigError(f"monitors.audit.people serves the labelling app and needs the feedback extra ({e.name} is "
                          "missing): pip install -e '.[feedback]'") from None
    if cfg.simulated and gold is None:
        raise ConfigError("monitors.audit.people.simulated needs the task's gold check for its labellers")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    sessions = open_db(cfg.db or str(Path(out_dir) / "audit_labels.db"))
    with sessions() as s:  # the operator's token, as `feedbackrl label admin-token` makes it
        admin = create_labeller(s, f"audit-admin-{uuid.uuid4().hex[:8]}", is_admin=True)[1]
        s.commit()
    server = LiveServer(create_app(sessions=sessions)).__enter__()
    api = AdminApi(server.url, admin)
    project = f"{cfg.project}-{uuid.uuid4().hex[:8]}"
    api.project = api.call("POST", "/api/projects", json={
        "name": project, "kind": "accept_reject", "overlap": cfg.overlap,
        "instructions": "Accept a response only if it fully does what the prompt asks."})["id"]
    audit = PeopleAudit(api, cfg.overlap, cfg.wait_s)
    for k in range(cfg.simulated):
        who = f"audit-sim-{k}-{uuid.uuid4().hex[:6]}"
        token = api.call("POST", "/api/labellers", json={"name": who})["token"]
        api.call("POST", f"/api/projects/{api.project}/members", json={"labeller": who})
        worker = HttpLabeller(server.url, token, api.project,
                              SimulatedLabeller(gold, cfg.temperature, seed=seed * 1009 + k), audit.problems)
        worker.start()
        audit.workers.append(worker)
    audit.on_close += [api.http.close, lambda: server.__exit__(None, None, None), sessions.kw["bind"].dispose]
    return audit
