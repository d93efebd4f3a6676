"""HTTP clients of the labelling app, for code that drives it from outside: the operator's side
(`AdminApi`: projects, labellers, items, status, export) and a simulated labeller that labels
through the API the way a person at the page does (`HttpLabeller`).
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from feedbackrl.data.labeller import SimulatedLabeller
from feedbackrl.rewards.verdict import Problem

Pairs = list[dict[str, Any]]
POLL_S = 0.2  # seconds between status polls
IDLE_S = 0.5  # seconds the labeller waits on an empty queue


class AdminApi:
    """The loop's side of the app, over HTTP with the admin token."""

    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        self.project = 0

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        r = self.http.request(method, path, **kwargs)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path} answered {r.status_code}: {r.text[:300]}")
        return r.json()

    def setup(self, project: str, labeller: str, instructions: str = "") -> str:
        """Create the pairwise project and the labeller, invite them; -> the labeller's token."""
        self.project = self.call("POST", "/api/projects", json={"name": project, "kind": "pairwise",
                                                               "instructions": instructions})["id"]
        token = self.call("POST", "/api/labellers", json={"name": labeller})["token"]
        self.call("POST", f"/api/projects/{self.project}/members", json={"labeller": labeller})
        return token

    def add_clip(self, data: bytes, media_type: str = "image/gif") -> str:
        """Upload a clip -> its reference ("clip:<sha256>") for an item's responses."""
        body = {"data": base64.b64encode(data).decode(), "media_type": media_type}
        return self.call("POST", f"/api/projects/{self.project}/clips", json=body)["ref"]

    def add_items(self, rows: list[dict[str, Any]]) -> list[int]:
        return self.call("POST", f"/api/projects/{self.project}/items", json={"items": rows})["item_ids"]

    def status(self) -> dict[str, int]:
        return self.call("GET", f"/api/projects/{self.project}/status")

    def pairs_since(self, since_id: int, ties: bool = False) -> Pairs:
        return self.call("GET", f"/api/projects/{self.project}/export", params={"since_id": since_id, "ties": ties})

    def wait_for_labels(self, target: int, wait_s: float, check: Callable[[], None] = lambda: None) -> None:
        """Block until the project has `target` active labels (a skip counts: it answers an item).
        `check` runs between polls and may raise (a labeller thread that died)."""
        deadline = time.monotonic() + wait_s
        while (have := self.status()["labels"]) < target:
            check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {wait_s:.0f} s for {target} labels, have {have} (online.wait_s)")
            time.sleep(POLL_S)


class Judge(Protocol):
    """What answers an item for `HttpLabeller` (`data.labeller.SimulatedLabeller`, or a control teacher):
    `problem` is whatever the loop filed under the item's prompt."""

    def judge(self, problem: Any, a: str, b: str) -> str: ...

    def accept(self, problem: Any, response: str) -> str: ...


class HttpLabeller(threading.Thread):
    """The simulated labeller as an HTTP client: fetch the next item, choose (a pair: "a", "b" or "tie"; one
    response: "accept" or "reject"), submit; until stopped.

    `problems` maps a prompt to its problem (the labeller knows the gold answer; the loop adds an
    entry before posting an item)."""

    def __init__(self, url: str, token: str, project: int, labeller: Judge | SimulatedLabeller,
                 problems: dict[str, Problem] | dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.project = url, token, project
        self.labeller, self.problems = labeller, problems
        self.stop = threading.Event()
        self.submitted = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60) as c:
                while not self.stop.is_set():
                    item = c.get(f"/api/projects/{self.project}/next").raise_for_status().json()["item"]
                    if item is None:
                        self.stop.wait(IDLE_S)
                        continue
                    problem = self.problems[item["prompt"]]
                    if len(item["responses"]) == 1:  # an accept/reject item
                        choice = self.labeller.accept(problem, item["responses"][0])
                    else:
                        a, b = item["responses"]
                        choice = self.labeller.judge(problem, a, b)
                    body = {"submission_id": uuid.uuid4().hex, "item_id": item["id"], "choice": choice}
                    c.post(f"/api/projects/{self.project}/labels", json=body).raise_for_status()
                    self.submitted += 1
        except BaseException as e:  # surfaced by `check`: the loop would otherwise wait forever
            self.error = e

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the simulated labeller failed: {self.error!r}") from self.error


def answer_rows(prompt: str, a: str, b: str, choice: str, ties: bool) -> Pairs:
    """One pairwise answer ("a", "b" or "tie") as the rows the loop's export gives for it, for code that
    labels in process: the preference pair, or for a tie a row marked "tie" if `ties`, else nothing."""
    if choice == "tie":
        return [{"prompt": prompt, "chosen": a, "rejected": b, "tie": True}] if ties else []
    chosen, rejected = (a, b) if choice == "a" else (b, a)
    return [{"prompt": prompt, "chosen": chosen, "rejected": rejected}]
