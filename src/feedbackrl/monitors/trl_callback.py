"""feedbackrl's monitors as a `transformers.TrainerCallback`, for TRL's trainers (GRPO, RLOO, DPO).

    from feedbackrl.monitors.trl_callback import MonitorCallback

    monitor = MonitorCallback(out_dir="runs/trl_grpo")
    trainer = GRPOTrainer(model=..., reward_funcs=monitor.watch(my_reward), args=GRPOConfig(logging_steps=1, ...),
                          train_dataset=..., callbacks=[monitor])
    trainer.train()

`watch(fn)` wraps a reward function (same name, same result) so the callback sees every batch TRL
scores: prompts, completions, rewards, and the dataset's `answer` column when there is one (what a
gold check or an audit compares with). At each log (`logging_steps`) the callback runs the detectors
over the completions scored since the last log, with TRL's logged metrics (`kl`, `entropy`,
`reward`, ... mapped to feedbackrl's names), writes `alerts.jsonl` and `samples.jsonl` under
`out_dir`, adds the monitor's statistics to the log entry kept in `state.log_history` (trackers
called before this callback do not see them), and honours a `stop` action
(`control.should_training_stop`). Several watched reward functions: their rewards are added, as
TRL does with equal weights. `rollback` and `raise_kl` are refused (the host owns its optimizer).

A trainer with no reward function to watch (TRL's `DPOTrainer`): the callback, added without `watch`,
checks the logged metrics alone at each log (`rewards/chosen`, `rewards/margins`, `entropy`, ...), so
the detectors that read metric rows run: `preference_displacement` (the margin rises while the chosen
answers grow less likely than under the reference), `entropy_collapse`. (TRL 1.x ships no PPO trainer.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from feedbackrl.config import MonitorsConfig
from feedbackrl.monitors.audit import AuditChannel
from feedbackrl.monitors.external import StepMonitor
from feedbackrl.monitors.monitor import GoldScore


class MonitorCallback(TrainerCallback):
    """The monitors at each TRL log step (module docstring)."""

    def __init__(self, cfg: MonitorsConfig | None = None, out_dir: str | Path | None = None,
                 gold: GoldScore | None = None, audits: list[AuditChannel] | None = None, audit_every: int = 5,
                 audit_samples: int = 32, answer_column: str = "answer") -> None:
        self.monitor = StepMonitor(cfg, out_dir, gold, audits, audit_every, audit_samples)
        self.answer_column = answer_column
        self._calls: dict[int, list[Any]] = {}  # id of the prompts list -> [prompts, completions, rewards, answers]
        self._order: list[int] = []
        self.decisions: list[Any] = []
        self.watched = False  # a reward function is watched (GRPO, RLOO); else only logged metrics are read (DPO)

    @property
    def alerts(self) -> list[Any]:
        return self.monitor.alerts

    def watch(self, fn: Callable[..., list[float | None]]) -> Callable[..., list[float | None]]:
        """`fn` as TRL calls it, recording what it scored (a reward of None counts as 0 here)."""

        self.watched = True

        @functools.wraps(fn)
        def watched(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
            rewards = fn(prompts, completions, **kwargs)
            key = id(prompts)  # TRL passes one prompts list to every reward function of a batch
            answers = kwargs.get(self.answer_column)
            if key not in self._calls:
                self._calls[key] = [list(prompts), list(completions), [0.0] * len(completions), answers]
                self._order.append(key)
            total = self._calls[key][2]
            for i, r in enumerate(rewards):
                total[i] += 0.0 if r is None else float(r)
            return rewards

        return watched

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        if logs is None or any(k.startswith("eval_") for k in logs):
            return control
        if not self._order:  # nothing watched (DPO: no reward function): the logged metrics alone
            if self.watched:
                return control  # a log between batches of a watched trainer
            return self._decide(state, control, logs, self.monitor.log(state.global_step, logs))
        prompts, completions, rewards, answers = [], [], [], []
        have_answers = all(self._calls[k][3] is not None for k in self._order)
        for k in self._order:
            p, c, r, a = self._calls[k]
            prompts += p
            completions += c
            rewards += r
            answers += list(a) if have_answers else []
        self._calls.clear()
        self._order.clear()
        decision = self.monitor.step(state.global_step, prompts, completions, rewards, logs,
                                     answers if have_answers else None)
        return self._decide(state, control, logs, decision)

    def _decide(self, state: Any, control: Any, logs: dict[str, Any], decision: Any) -> Any:
        self.decisions.append(decision)
        logs.update(decision.metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(decision.metrics)
        if decision.stop:
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.monitor.close()
        return control
