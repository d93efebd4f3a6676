"""Segment-pair labels from the labelling app: each pair of a labelling round becomes an item with two clips.

With `control.preferences.labels_from = "app"` the run serves the labelling app (`feedback/`, on 127.0.0.1, its
database `control.preferences.app.db`, default OUT/labels.db) for as long as it trains, the way the online
reward-model loop does (`train/online_labels.py`), and asks through the same `LabelQueue`: post the round's
items, wait until each is answered, fetch the labels since the last round once each. Per pair:

- the two segments' frames (rendered before each step, from `rgb_array`, shrunk to 300 px) become two
  animated GIFs, uploaded as clips of the project; after an episode ends inside a segment its absorbing steps
  show the last real frame dimmed, so both clips last `segment_len` frames and the end is visible;
- the item is ``{"prompt": "round R, pair i: ...", "responses": [clip of the first, clip of the second]}``;
  the page shows them side by side (in a per-labeller shuffled order, translated back when stored);
- the answer maps back to the teacher's code: the first preferred 1, the second 0, "tie" 1/2 (the teacher's
  "equal"), "skip" no label (the query still counts against the budget, like the skip teacher's).

Who answers (`app.labeller`): "simulated", the run's B-Pref teacher as an HTTP client in a thread
(`feedback.client.HttpLabeller` with `TeacherJudge`: it knows each pair's true rewards, nothing the learner
computes); or "people": the run prints the page's URL and a labeller token (also in OUT/labelling.json) and
waits up to `app.wait_s` per round. Two segments whose clips come out byte-identical cannot be an item (its
responses must differ): they are not asked and count as skipped.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from feedbackrl.config import ConfigError, RunConfig
from feedbackrl.control.preferences import Segments
from feedbackrl.control.rollout import Rollout
from feedbackrl.control.teachers import Teacher
from feedbackrl.log import console

CHOICES = {1.0: "a", 0.0: "b", 0.5: "tie"}


class TeacherJudge:
    """The simulated teacher as the app's HTTP labeller asks it: an item's problem is the pair's per-step true
    rewards, (L,) each -> "a" (the first), "b", "tie" or "skip"."""

    def __init__(self, teacher: Teacher, seed: int) -> None:
        self.teacher, self.generator = teacher, torch.Generator().manual_seed(seed)

    def judge(self, problem: tuple[Tensor, Tensor], a: str, b: str) -> str:
        label = float(self.teacher.label(problem[0][None], problem[1][None], self.generator)[0])
        return "skip" if math.isnan(label) else CHOICES[label]

    def accept(self, problem: Any, response: str) -> str:
        raise ValueError("a segment teacher compares two clips; it has no accept/reject answer")


def segment_frames(ro: Rollout, start: int, env: int, mask: Tensor) -> list[np.ndarray]:
    """The frames of one segment: its real steps, then the last real one dimmed for each absorbing step."""
    assert ro.frames is not None, "the round's rollout was collected without frames"
    real = int(mask.sum())
    frames = [ro.frames[start + t][env] for t in range(real)]
    dimmed = (frames[-1].astype(np.float32) * 0.35 + 150).astype(np.uint8)
    return frames + [dimmed] * (len(mask) - real)


class AppLabels:
    """The app served for the run and the learner's `Ask` (`preferences.Ask`); a context manager."""

    def __init__(self, cfg: RunConfig, out_dir: Path) -> None:
        self.cfg, self.out_dir = cfg, out_dir
        self.app = cfg.control.preferences.app
        self.problems: dict[str, tuple[Tensor, Tensor]] = {}  # item prompt -> the pair's true rewards
        self.worker: Any = None
        self.asked_items = 0

    def __enter__(self) -> AppLabels:
        try:
            from feedbackrl.feedback.app import create_app
            from feedbackrl.feedback.client import AdminApi, HttpLabeller
            from feedbackrl.feedback.server import LiveServer
            from feedbackrl.feedback.store import create_labeller, open_db
            from feedbackrl.train.online_labels import LabelQueue
        except ImportError as e:
            raise ConfigError(f"control.preferences.labels_from = 'app' serves the labelling app and needs the "
                              f"feedback extra ({e.name} is missing): pip install 'feedbackrl[feedback]'") from None
        self.sessions = open_db(self.app.db or str(self.out_dir / "labels.db"))
        with self.sessions() as s:  # the operator's token, as `feedbackrl label admin-token` makes it
            admin = create_labeller(s, f"control-admin-{uuid.uuid4().hex[:8]}", is_admin=True)[1]
            s.commit()
        self.server = LiveServer(create_app(sessions=self.sessions)).__enter__()
        self.api = AdminApi(self.server.url, admin)
        c = self.cfg.control
        name = f"{c.env}-segments-{uuid.uuid4().hex[:8]}"
        instructions = (f"Two clips of {c.env}, {c.preferences.segment_len} steps each. Which shows the better "
                        "behaviour? 1: the left, 2: the right, t: equally good, s: skip, p: play both again. A clip "
                        "dims once its episode has ended.")
        labeller = f"{self.app.labeller}-{uuid.uuid4().hex[:8]}"
        token = self.api.setup(name, labeller, instructions)
        check = lambda: None  # noqa: E731
        if self.app.labeller == "simulated":
            t = c.preferences.teacher
            judge = TeacherJudge(Teacher(t.beta, t.mistake, t.skip_below, t.equal_within, t.gamma),
                                 self.cfg.train.seed + 3)
            self.worker = HttpLabeller(self.server.url, token, self.api.project, judge, self.problems)
            self.worker.start()
            check = self.worker.check
        else:
            where = {"url": f"{self.server.url}/projects/{self.api.project}", "login": f"{self.server.url}/login",
                     "labeller": labeller, "token": token, "project": self.api.project}
            (self.out_dir / "labelling.json").write_text(json.dumps(where, indent=2))
            console.print(f"label segment pairs at {where['login']} with the token {token} "
                          f"(also in {self.out_dir / 'labelling.json'})")
        self.queue = LabelQueue(self.api, self.app.wait_s, check, ties=True)
        return self

    def __call__(self, step: int, a: Segments, b: Segments, where_a: Tensor, where_b: Tensor,
                 ro: Rollout) -> Tensor:
        from feedbackrl.control.video import encode_gif

        labels = torch.full((len(a.mask),), float("nan"))
        rows, index = [], {}
        for i in range(len(labels)):
            refs = [self.api.add_clip(encode_gif(segment_frames(ro, int(w[i, 0]), int(w[i, 1]), seg.mask[i]),
                                                 self.app.fps))
                    for seg, w in ((a, where_a), (b, where_b))]
            if refs[0] == refs[1]:
                continue  # identical clips: nothing to compare (counted as skipped)
            prompt = f"round at update {step + 1}, pair {i + 1}: which clip shows the better behaviour?"
            self.problems[prompt] = (a.gold[i], b.gold[i])
            index[prompt] = (i, refs[0])
            rows.append({"prompt": prompt, "responses": refs, "update": step + 1})
        if rows:
            for row in self.queue.ask(rows):
                i, first = index[row["prompt"]]
                labels[i] = 0.5 if row.get("tie") else float(row["chosen"] == first)
        self.asked_items += len(rows)
        return labels

    def __exit__(self, *exc: object) -> None:
        if self.worker is not None:
            self.worker.stop.set()
            self.worker.join(timeout=10)
        self.api.http.close()
        self.server.__exit__(*exc)
        self.sessions.kw["bind"].dispose()
