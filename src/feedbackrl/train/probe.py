"""`constraint.probe_prompts`: a fixed set of probe prompts whose costs the Lagrange multiplier steps on.

The multiplier's J_C is a windowed mean (or upper bound) of costs. Taken over the training batches, it moves
with which prompts the steps happened to draw: when the cost is mostly decided by the prompt, a run of draws
with few costly prompts lowers J_C though the policy did not change, and lambda follows it down. A probe set
removes that: N prompts drawn once, before the first step, from the task's training distribution
(`Task.sample`, which never returns a held-out problem) with their own seeded RNG, or with `probe_from =
"heldout"` the N held-out problems after the `task.heldout_size` ones that are evaluated and released on
(`heldout_probes`: the held-out distribution, whose composition the training words may not share, with no
evaluated prompt among them, and the same N for every seed); each step the current
policy samples one completion for the next `probe_per_step` of them in a fixed cycle (`algos.constrained.
probe_cycle`; the first step samples a whole window), without gradients, scored by the run's scorer (the
recipe's `[cost]`). The window then holds the latest cost of every probe prompt, so J_C is the mean cost of
the same prompts at every step.

The probes are rolled out through the task's kind (`episodes.kinds.collect`) as one batch of
`probe_per_step` prompts and one completion each, with the task wrapped so that it draws the probe prompts and
is not told their verdicts (`Task.observe`: an adaptive task's difficulty never moves with them). Nothing of
the training RNG streams is used: the twin run without `[constraint]` draws the same training prompts.

State in each checkpoint (`PROBE_FILE`): the cycle's position, the sampling generator and a fingerprint of the
probe prompts, which are drawn again from the task in its initial state on resume (a mismatch is an error).
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.constrained import probe_cycle
from feedbackrl.config import ConfigError, ConstraintConfig, RolloutConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Scorer
from feedbackrl.episodes.kinds import collect
from feedbackrl.rewards.verdict import Problem

PROBE_FILE = "probe.pt"  # in each checkpoint of a run with constraint.probe_prompts


def _seed(label: str, seed: int) -> int:
    """A 63-bit seed from a label and train.seed: the same on every platform and Python version."""
    return int.from_bytes(hashlib.sha256(f"{label}:{seed}".encode()).digest()[:8], "little") >> 1


def fingerprint(problems: list[Problem]) -> str:
    """sha256 of the probe prompts, in order: what a checkpoint checks the probe set against."""
    h = hashlib.sha256()
    for p in problems:
        h.update(repr(p.prompt).encode())
        h.update(b"\0")
    return h.hexdigest()


def heldout_probes(task: Task, heldout_size: int, count: int) -> list[Problem]:
    """constraint.probe_from = "heldout": `task.heldout(heldout_size + count)[heldout_size:]`, the `count` held-out
    problems that follow the `heldout_size` ones evaluated (`task.heldout(heldout_size)`, the release test's set):
    the same generator as the evaluated set, never trained on (`Task.sample` never returns a held-out problem).
    A ConfigError when the task cannot hand out that many, or when one of them repeats an evaluated prompt (a
    held-out list that cycles, or one that is not the same list on every call)."""
    try:
        evaluated, enlarged = task.heldout(heldout_size), task.heldout(heldout_size + count)
    except ValueError as e:  # a task's own "only so many held-out problems" (DatasetError is one)
        raise ConfigError(f"constraint.probe_from = 'heldout' needs task.heldout_size + constraint.probe_prompts = "
                          f"{heldout_size} + {count} held-out problems: {e}") from None
    if len(enlarged) != heldout_size + count or [p.prompt for p in enlarged[:heldout_size]] != [
            p.prompt for p in evaluated]:
        raise ConfigError(f"constraint.probe_from = 'heldout': task {task.name!r}'s heldout({heldout_size + count}) "
                          f"does not begin with its heldout({heldout_size}), the evaluated set; the probe prompts "
                          "cannot be told apart from it: use probe_from = 'train'")
    probes, seen = enlarged[heldout_size:], {p.prompt for p in evaluated}
    repeated = sum(p.prompt in seen for p in probes)
    if repeated:
        raise ConfigError(f"constraint.probe_from = 'heldout': {repeated} of the {count} probe prompts after the "
                          f"{heldout_size} evaluated held-out problems of task {task.name!r} repeat an evaluated "
                          "prompt (its held-out split holds fewer distinct problems than heldout_size + "
                          "probe_prompts): lower constraint.probe_prompts or task.heldout_size, or use probe_from = "
                          "'train'")
    return probes


class _ProbeTask:
    """The task, drawing the probe prompts handed to it (in order) and not told their verdicts."""

    def __init__(self, task: Task, problems: list[Problem]) -> None:
        self._task, self._next = task, iter(problems)

    def sample(self, rng: random.Random) -> Problem:
        return next(self._next)

    def observe(self, problems: Any, verdicts: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:  # everything else is the task's own (kind, verify, difficulty, ...)
        return getattr(self._task, name)


@dataclass
class ProbeSet:
    """The probe prompts, where the cycle through them is, and the generator their completions are sampled with."""

    problems: list[Problem]
    per_step: int  # prompts sampled each step after the first
    fill: int  # costs sampled at the first step: a whole window
    generator: torch.Generator
    position: int = 0
    calls: int = 0

    @classmethod
    def draw(cls, task: Task, cfg: ConstraintConfig, seed: int, heldout_size: int) -> ProbeSet:
        """`cfg.probe_prompts` prompts: with probe_from = "train" from `task.sample` with an RNG of their own
        (seeded by `seed`, train.seed); with "heldout" the held-out problems after the first `heldout_size`
        (task.heldout_size, the evaluated ones): `heldout_probes`."""
        if cfg.probe_prompts < 1:
            raise ValueError(f"constraint.probe_prompts must be >= 1 to draw a probe set, got {cfg.probe_prompts}")
        if cfg.probe_from == "heldout":
            problems = heldout_probes(task, heldout_size, cfg.probe_prompts)
        else:
            rng = random.Random(_seed("constraint.probe_prompts", seed))
            problems = [task.sample(rng) for _ in range(cfg.probe_prompts)]
        generator = torch.Generator().manual_seed(_seed("constraint.probe_sampling", seed))
        return cls(problems, cfg.probe_per_step or cfg.probe_prompts, cfg.window, generator)

    def collect(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, scorer: Scorer,
                rollout: RolloutConfig) -> tuple[Tensor, dict[str, float]]:
        """This step's probe costs, (count,) in cycle order, and `constraint/probe_cost` (their mean) with
        `constraint/probe_n` and `perf/probe_s`."""
        t0 = time.perf_counter()
        total = self.fill if self.calls == 0 else self.per_step
        costs = []
        while total > 0:  # the first step's window in chunks of per_step prompts
            count = min(total, self.per_step)
            indices, position = probe_cycle(self.position, count, len(self.problems))
            cfg = rollout.model_copy(update={"prompts_per_step": count, "group_size": 1})
            batch = collect(model, tokenizer, _ProbeTask(task, [self.problems[i] for i in indices]), scorer, cfg,
                            random.Random(0), self.generator)
            if "cost" not in batch.signals:
                raise ValueError("constraint.probe_prompts: the scorer gave the probe completions no cost; "
                                 "the run needs a [cost] section")
            costs.append(batch.signals["cost"].detach().float().cpu())
            self.position, total = position, total - count
        self.calls += 1
        out = torch.cat(costs)
        return out, {"constraint/probe_cost": out.mean().item(), "constraint/probe_n": float(len(out)),
                     "perf/probe_s": time.perf_counter() - t0}

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "calls": self.calls, "generator": self.generator.get_state(),
                "fingerprint": fingerprint(self.problems), "size": len(self.problems)}

    def load_state_dict(self, data: dict[str, Any], generator: bool = True) -> None:
        """The checkpoint's cycle position (and, unless `generator` is False, the sampling generator's state)."""
        if data["fingerprint"] != fingerprint(self.problems):
            raise ValueError(f"the checkpoint's probe prompts ({data['size']}) are not the ones this run draws "
                             f"({len(self.problems)}): resume with the recipe, train.seed and task it was trained "
                             "with")
        self.position, self.calls = int(data["position"]), int(data["calls"])
        if generator:
            self.generator.set_state(data["generator"])
