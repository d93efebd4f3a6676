"""The monitors for a training loop that is not feedbackrl's: one call per step, the same detectors and alerts.

    from feedbackrl.monitors.external import StepMonitor

    monitor = StepMonitor(out_dir="runs/mine")          # [monitors] defaults; or StepMonitor(MonitorsConfig(...))
    for step in range(1, steps + 1):
        ...                                               # sample, score, update
        decision = monitor.step(step, prompts, completions, rewards, {"kl/mean": kl, "entropy/mean": ent})
        if decision.stop:
            break

`prompts[i]` is the prompt that `completions[i]` answers; rows answering one prompt come together
(a GRPO group). `metrics` may use feedbackrl's names (`kl/mean`, `entropy/mean`, `reward/mean`) or
TRL's (`kl`, `entropy`, `reward`, `reward_std`), which are mapped. `answers` (a reference answer per
row) is what a gold check or an audit source compares with; without it they see "". Decisions:
`stop` is the loop's to honour; `rollback` and `raise_kl` need the loop's optimizer and KL
coefficient, so they are refused here (a recipe's actions for feedbackrl's own loops).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feedbackrl.config import AuditConfig, MonitorsConfig
from feedbackrl.monitors.audit import AuditChannel
from feedbackrl.monitors.monitor import Decision, GoldScore, Monitor
from feedbackrl.rewards.verdict import Problem, Verdict

# other libraries' metric names -> the names the detectors read
METRIC_NAMES = {"kl": "kl/mean", "entropy": "entropy/mean", "reward": "reward/mean", "reward_std": "reward/std",
                "objective/kl": "kl/mean", "objective/entropy": "entropy/mean",
                "rewards/chosen": "pref/reward_chosen", "rewards/margins": "pref/reward_margin"}
HOST_ACTIONS = ("log", "stop")


def text_of(x: Any) -> str:
    """A prompt or completion as text: a string as it is, a chat (list of {"role", "content"}) as its contents."""
    if isinstance(x, str):
        return x
    if isinstance(x, list | tuple):
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in x)
    return str(x)


@dataclass
class _Batch:
    problems: list[Problem]
    texts: list[str]
    verdicts: list[Verdict]


def as_batch(prompts: Sequence[Any], completions: Sequence[Any], rewards: Sequence[float],
             answers: Sequence[str] | None = None, passed: Sequence[bool] | None = None) -> _Batch:
    """The rows as a monitor's batch; consecutive rows with one prompt share one Problem (a group)."""
    n = len(completions)
    if not (len(prompts) == n == len(rewards)) or (answers is not None and len(answers) != n) or (
            passed is not None and len(passed) != n):
        extra = "".join(f", {len(x)}" for x in (answers, passed) if x is not None)
        raise ValueError(f"monitor step: prompts, completions, rewards (and answers, passed) need one entry per "
                         f"completion; got {len(prompts)}, {n}, {len(rewards)}{extra}")
    problems: list[Problem] = []
    for i in range(n):
        prompt, answer = text_of(prompts[i]), "" if answers is None else str(answers[i])
        same = problems and problems[-1].prompt == prompt and problems[-1].answer == answer
        problems.append(problems[-1] if same else Problem(prompt, answer))
    verdicts = []
    for i, r in enumerate(rewards):
        score = float(r)
        ok = bool(passed[i]) if passed is not None else score > 0
        verdicts.append(Verdict(min(max(score, 0.0), 1.0), ok, "", {"raw_reward": score}))
    return _Batch(problems, [text_of(c) for c in completions], verdicts)


class StepMonitor:
    """feedbackrl's monitors behind one call per step (module docstring). Rewards are clipped into [0, 1] for
    the detectors (the raw value is kept in each verdict's details). `audits` built in code are sampled every
    `audit_every` steps, `audit_samples` completions each (a config's `audit.every`, when set, wins)."""

    def __init__(self, cfg: MonitorsConfig | None = None, out_dir: str | Path | None = None,
                 gold: GoldScore | None = None, audits: list[AuditChannel] | None = None, audit_every: int = 5,
                 audit_samples: int = 32) -> None:
        cfg = cfg or MonitorsConfig()
        if audits and not cfg.audit.every:  # channels given in code: the schedule comes with them
            if audit_every < 1 or audit_samples < 1:
                raise ValueError(f"audit_every and audit_samples must be >= 1, got {audit_every}, {audit_samples}")
            cfg = cfg.model_copy(update={"audit": AuditConfig.model_construct(
                **{**cfg.audit.model_dump(), "every": audit_every, "samples": audit_samples})})
        refused = {d: a for d, a in cfg.actions.items() if a not in HOST_ACTIONS}
        if refused:
            raise ValueError(f"monitors.actions {refused}: outside feedbackrl's loops a monitor can only log or stop "
                             "(rollback and raise_kl need the loop's optimizer and KL coefficient)")
        self.monitor = Monitor(cfg, out_dir, gold, audits=audits)

    @property
    def alerts(self) -> list[Any]:
        return self.monitor.alerts

    def step(self, step: int, prompts: Sequence[Any], completions: Sequence[Any], rewards: Sequence[float],
             metrics: dict[str, Any] | None = None, answers: Sequence[str] | None = None,
             passed: Sequence[bool] | None = None) -> Decision:
        """Check one step: its completions with their rewards and the loop's logged metrics -> the decision."""
        batch = as_batch(prompts, completions, rewards, answers, passed)
        row = {METRIC_NAMES.get(k, k): v for k, v in (metrics or {}).items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
        row.setdefault("reward/mean", sum(float(r) for r in rewards) / max(len(rewards), 1))
        return self.monitor.after_step(step, batch, row)

    def log(self, step: int, metrics: dict[str, Any]) -> Decision:
        """Check one step of a loop that has no completions to show, only logged metrics (TRL's DPO trainer:
        `rewards/chosen`, `rewards/margins`, ...): the detectors that read metric rows (`preference_displacement`,
        `kl_blowup`, `entropy_collapse`, ...) check them."""
        row = {METRIC_NAMES.get(k, k): v for k, v in metrics.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
        return self.monitor.after_metrics(step, row)

    def close(self) -> None:
        self.monitor.close()
