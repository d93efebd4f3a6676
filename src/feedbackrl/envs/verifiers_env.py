"""Environments written for the `verifiers` library (0.4, `verifiers.v1`), trained on with our loop.

`[task] name = "verifiers"`, `options.env` = the environment's module name (its taskset id, as
``vf-eval`` takes it). `verifiers` pins openai, mcp, pydantic and numpy versions that differ from
ours, so it lives in its own virtualenv (`options.python`, default ``.venv-verifiers/bin/python``;
docs/agents.md says how to make it) and never in this process: each call runs
`verifiers_driver.py` there as a subprocess, which loads the environment by name, plays its
episodes with its own machinery (its harness program in the local subprocess runtime, its
interception server, its rewards) against the policy's loopback endpoint, and prints the traces.

Tokens: verifiers' training client tokenizes on its side (the tokenizer in `tokenizer_dir`, which
must carry a chat template) and calls vLLM's token-in/token-out route on our server, so each trace
holds the exact ids the policy saw and sampled, and the log-prob of each sampled token. We train
on the trace's first branch as recorded: prompt = the tokens before the first sampled one, loss mask
= verifiers' own sampled-token mask (so a multi-turn trace's environment messages get no loss).

Problems: the taskset must be bounded (a list). Its last `heldout_tasks` tasks are held out (never drawn
for training, `heldout(n)` hands them out in order); training draws uniformly from the rest.
Rewards: the trace's reward (the weighted sum of the task's `@vf.reward`s) is trained on as is;
the verdict's score is that reward clipped to [0, 1] (`Verdict` needs a score in [0, 1]); it
passes at `pass_threshold`. `verify` (one bare completion) is not available: verifiers judges
whole traces, so evaluation plays whole episodes too.

SFT warm start (`[sft]`): a task whose data has a string `answer` field (the convention of
verifiers' own examples) demonstrates it as the completion of its raw prompt text. That is the text
verifiers renders for a model without a chat template (the minimal template); a model with its own
template would need its prompts rendered the same way, which is not done.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedbackrl.envs.external import ExternalEpisode, ExternalTask
from feedbackrl.envs.multi_turn import END_ANSWERED, END_ERROR, END_TRUNCATED, EpisodeRecord
from feedbackrl.rewards.verdict import Problem, Verdict

DRIVER = Path(__file__).with_name("verifiers_driver.py")
DEFAULT_PYTHON = ".venv-verifiers/bin/python"


class VerifiersError(RuntimeError):
    """The verifiers virtualenv is missing, or its driver failed."""


@dataclass
class VerifiersTask(ExternalTask):
    """A `verifiers` v1 environment (see the module docstring for each option)."""

    env: str = ""  # the environment's module name (taskset id)
    python: str = DEFAULT_PYTHON  # the verifiers virtualenv's interpreter
    path: list[str] = field(default_factory=list)  # directories the driver puts on sys.path (local envs)
    taskset: dict[str, Any] = field(default_factory=dict)  # the taskset's config fields
    harness: str = "null"  # the agent's harness id ("null": a plain chat loop; "bash" runs shell commands)
    max_turns: int = 0  # model turns per episode (0: the environment's own stop conditions)
    # verifiers' renderer (a `renderers` config): "default" renders with the tokenizer's chat template and
    # parses no tool calls; a model verifiers knows takes its own (e.g. {name = "qwen3"}) to parse them
    renderer: dict[str, Any] = field(default_factory=lambda: {"name": "default"})
    heldout_tasks: int = 0  # the taskset's last `heldout_tasks` tasks are held out
    pass_threshold: float = 1.0  # an episode passes when its reward reaches this
    max_concurrent: int = 4  # episodes in flight at once
    timeout_s: float = 900.0  # wall-clock limit for one driver call
    name: str = "verifiers"
    _tasks: list[dict[str, Any]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.env:
            raise ValueError("verifiers: options.env (the environment's module name) is required")
        if self.heldout_tasks < 0 or self.max_turns < 0 or self.max_concurrent < 1:
            raise ValueError("verifiers: heldout_tasks and max_turns must be >= 0, max_concurrent >= 1")

    # -- the driver -----------------------------------------------------------------------------

    def _python(self) -> str:
        # absolute, so the bin directory added to PATH holds from the harness's own working directory;
        # not resolved: a virtualenv's python is a link whose target is the base interpreter
        exe = Path(os.path.abspath(Path(self.python).expanduser()))
        if not exe.is_file():
            raise VerifiersError(
                f"verifiers: no interpreter at {self.python!r}; make the verifiers virtualenv "
                f"(`make verifiers-venv`, see docs/agents.md) or set options.python")
        return str(exe)

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        req = {"env": self.env, "taskset": self.taskset, "path": [str(Path(p).resolve()) for p in self.path],
               **request}
        exe = self._python()
        # the harness program is a uv script: uv (installed in the same virtualenv) must be on PATH, else
        # verifiers falls back to `pip install --user uv`
        env = {**os.environ, "PATH": f"{Path(exe).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        try:
            proc = subprocess.run([exe, str(DRIVER)], input=json.dumps(req), capture_output=True, text=True,
                                  timeout=self.timeout_s, env=env)
        except subprocess.TimeoutExpired as e:
            raise VerifiersError(f"verifiers: the driver ran past {self.timeout_s} s ({request['command']})") from e
        if proc.returncode != 0:
            raise VerifiersError(f"verifiers: the driver failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        lines = proc.stdout.strip().splitlines()
        if not lines:
            raise VerifiersError(f"verifiers: the driver printed nothing:\n{proc.stderr[-3000:]}")
        return json.loads(lines[-1])

    @property
    def tasks(self) -> list[dict[str, Any]]:
        """The taskset's tasks (index, prompt), listed by the driver on first use."""
        if self._tasks is None:
            self._tasks = self._call({"command": "list"})["tasks"]
            if len(self._tasks) <= self.heldout_tasks:
                raise VerifiersError(f"verifiers: {self.env!r} has {len(self._tasks)} tasks, "
                                     f"heldout_tasks = {self.heldout_tasks} leaves none to train on")
        return self._tasks

    # -- Task -----------------------------------------------------------------------------------

    @staticmethod
    def _problem(t: dict[str, Any]) -> Problem:
        prompt = t["prompt"] if isinstance(t["prompt"], str) else json.dumps(t["prompt"])
        return Problem(prompt=prompt or "", answer=t.get("answer"),
                       meta={"idx": t["idx"], "system_prompt": t.get("system_prompt"),
                             "messages": not isinstance(t["prompt"], str | None)})

    def sample(self, rng: random.Random) -> Problem:
        return self._problem(self.tasks[rng.randrange(len(self.tasks) - self.heldout_tasks)])

    def heldout(self, n: int) -> list[Problem]:
        if n > self.heldout_tasks:
            raise ValueError(f"verifiers: {n} held-out problems asked for, options.heldout_tasks = "
                             f"{self.heldout_tasks}")
        return [self._problem(t) for t in self.tasks[len(self.tasks) - self.heldout_tasks:][:n]]

    def demonstrate(self, problem: Problem, rng: random.Random) -> str:
        if not isinstance(problem.answer, str) or problem.meta["system_prompt"] or problem.meta["messages"]:
            raise ValueError(f"verifiers: SFT demonstrations need tasks with a string prompt, no system prompt and "
                             f"a string `answer` field; {self.env!r} task {problem.meta['idx']} has none")
        return problem.answer

    def verify(self, problem: Problem, completion: str) -> Verdict:
        raise NotImplementedError("verifiers environments judge whole traces, not a bare completion: "
                                  "episodes are played through `play`")

    # -- ExternalTask ---------------------------------------------------------------------------

    def play(self, endpoint: str, tokenizer_dir: str, problems: Sequence[Problem],
             sampling: dict[str, Any]) -> list[ExternalEpisode]:
        out = self._call({"command": "run", "harness": self.harness, "max_turns": self.max_turns,
                          "tasks": [p.meta["idx"] for p in problems], "base_url": endpoint, "model": "policy",
                          "tokenizer": tokenizer_dir, "sampling": sampling, "max_concurrent": self.max_concurrent,
                          "client": "train", "renderer": self.renderer})
        return [self._episode(p, e) for p, e in zip(problems, out["episodes"], strict=True)]

    def _episode(self, problem: Problem, e: dict[str, Any]) -> ExternalEpisode:
        reward = float(e["reward"]) if e["ok"] else 0.0
        evidence = {"rewards": e["rewards"], "raw_reward": e["reward"], "stop_condition": e["stop_condition"],
                    "errors": e["errors"], "branches": e["branches"]}
        score = min(1.0, max(0.0, reward))
        if not e["ok"]:
            end, reason = END_ERROR, "episode failed: " + "; ".join(e["errors"])[:300]
        else:
            end = END_TRUNCATED if e["is_truncated"] else END_ANSWERED
            reason = f"reward {reward:.4g} ({', '.join(f'{k} {v}' for k, v in e['rewards'].items())})"
        verdict = Verdict(score, e["ok"] and reward >= self.pass_threshold, reason, evidence)
        messages = e["messages"][1:] if e["messages"] else []
        turns = sum(m["role"] == "assistant" for m in messages)
        record = EpisodeRecord(prompt=problem.prompt, messages=e["messages"], turn_rewards=[0.0] * turns,
                               tool_calls=sum(len(m.get("tool_calls") or []) for m in messages), end=end,
                               verdict=verdict, reward=reward)
        return ExternalEpisode(e["token_ids"], e["sampled_mask"], e["logprobs"], reward, record)

