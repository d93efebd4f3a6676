"""The live monitor: one call after every on-policy step, alerts out, actions for the loop.

    decision = monitor.after_step(step, batch, metrics)
    metrics.update(decision.metrics)      # monitor/* statistics and alert/<detector> values
    ... log, checkpoint ...
    if decision.raise_kl: kl_coef = monitor.raised_kl(kl_coef)
    if decision.rollback: <restore the last checkpoint>; monitor.rolled_back(checkpoint_step)
    if decision.stop: break

Each detector fires at most once per run (after a rollback it is armed again), so a run that
stays hacked gives one alert per detector, not one per step. The action of an alert is the
recipe's `[monitors] actions` entry for its detector (default "log"); a rollback past
`max_rollbacks` becomes a stop.

Files (when `out_dir` is given): `alerts.jsonl` (one `Alert` per line) and `samples.jsonl`
(`samples_per_step` completions with their verdicts per step), which `feedbackrl monitor RUN_DIR`
replays.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedbackrl.config import MonitorsConfig
from feedbackrl.monitors.audit import PASS, AuditChannel, merge
from feedbackrl.monitors.base import Alert, Detector
from feedbackrl.monitors.record import RolloutBatch, StepRecord, sample_rows, spread
from feedbackrl.monitors.registry import build_detectors
from feedbackrl.rewards.verdict import Problem

GoldScore = Callable[[Problem, str], float]
ALERTS_FILE, SAMPLES_FILE = "alerts.jsonl", "samples.jsonl"
EXAMPLES = 3  # example completions per alert


@dataclass
class Decision:
    """What the monitor says after a step: metrics to log, the alerts, and what the loop should do."""

    metrics: dict[str, float] = field(default_factory=dict)
    alerts: list[Alert] = field(default_factory=list)

    def _wants(self, action: str) -> bool:
        return any(a.action == action for a in self.alerts)

    @property
    def stop(self) -> bool:
        return self._wants("stop")

    @property
    def rollback(self) -> bool:
        return self._wants("rollback") and not self.stop

    @property
    def raise_kl(self) -> bool:
        return self._wants("raise_kl")


class Monitor:
    """Runs the configured detectors over each step; `gold` is an optional hidden check (gold_every),
    `audits` the channels a sample goes to every `audit.every` steps (`monitors.audit`)."""

    def __init__(self, cfg: MonitorsConfig, out_dir: str | Path | None = None, gold: GoldScore | None = None,
                 detectors: list[Detector] | None = None, audits: list[AuditChannel] | None = None) -> None:
        self.cfg = cfg
        self.audits = list(audits or [])
        if self.audits and not cfg.audit.every:
            raise ValueError("monitor: audit channels given but monitors.audit.every = 0 (they would never run)")
        names = [a.name for a in self.audits]
        if len(set(names)) != len(names):
            raise ValueError(f"monitor: audit channel names must be distinct, got {names}")
        self.detectors = detectors if detectors is not None else build_detectors(cfg.detectors, cfg.options)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.gold = gold
        self.rows: list[dict[str, Any]] = []  # one metrics row per step seen, oldest first
        self.fired: set[str] = set()
        self.rollbacks = 0
        self.alerts: list[Alert] = []

    @property
    def needs_reference(self) -> bool:
        """A raise_kl action (or `monitors.reference`) needs a frozen reference even when kl_coef = 0."""
        return self.cfg.reference or "raise_kl" in self.cfg.actions.values()

    @property
    def needs_rollback(self) -> bool:
        return "rollback" in self.cfg.actions.values()

    def after_step(self, step: int, batch: RolloutBatch, metrics: dict[str, Any]) -> Decision:
        """Measure the step's completions, check every detector, write samples and alerts."""
        record = StepRecord.from_batch(step, batch)
        stats = self._gold_sample(step, record, batch.problems)
        stats.update(self._audit(step, record, batch.problems))
        for d in self.detectors:
            stats.update(d.measure(record))
        alerts = self.observe(step, record, {**metrics, **stats})
        stats["monitor/alerts"] = float(len(alerts))
        stats.update({f"alert/{a.detector}": a.statistic for a in alerts})
        self._write(record, alerts)
        return Decision(stats, alerts)

    def after_metrics(self, step: int, metrics: dict[str, Any]) -> Decision:
        """A step with logged metrics and no completions to read (a host's DPO trainer): the detectors that read
        metric rows check them, alerts are written as after `after_step`."""
        record = StepRecord(step, [], [], [], [], [])
        alerts = self.observe(step, record, dict(metrics))
        stats = {"monitor/alerts": float(len(alerts)), **{f"alert/{a.detector}": a.statistic for a in alerts}}
        self._write(record, alerts)
        return Decision(stats, alerts)

    def observe(self, step: int, record: StepRecord, row: dict[str, Any]) -> list[Alert]:
        """Append one step's metrics row and check the detectors not yet fired; live and replay share this."""
        self.rows.append({**row, "step": step})
        alerts = []
        for d in self.detectors:
            if d.name in self.fired or (finding := d.check(self.rows)) is None:
                continue
            self.fired.add(d.name)
            alerts.append(Alert(d.name, d.kind, step, finding.statistic, finding.threshold, finding.message,
                                self._action(d.name), d.examples(record, EXAMPLES)))
        self.alerts.extend(alerts)
        return alerts

    def _action(self, detector: str) -> str:
        action = self.cfg.actions.get(detector, "log")
        return "stop" if action == "rollback" and self.rollbacks >= self.cfg.max_rollbacks else action

    def raised_kl(self, kl_coef: float) -> float:
        """The KL coefficient after a raise_kl action: times `kl_raise`, and at least `kl_floor`."""
        return max(kl_coef * self.cfg.kl_raise, self.cfg.kl_floor)

    def rolled_back(self, to_step: int) -> None:
        """The loop restored the checkpoint of `to_step`: forget later rows and arm every detector again."""
        self.rows = [r for r in self.rows if r["step"] <= to_step]
        self.fired.clear()
        self.rollbacks += 1

    def _gold_sample(self, step: int, record: StepRecord, problems: list[Problem]) -> dict[str, float]:
        """Every `gold_every` steps (and at step 1, the baseline): gold vs proxy on a spread sample."""
        every = self.cfg.gold_every
        if self.gold is None or not every or (step % every and step != 1):
            return {}
        rows = spread(len(record), self.cfg.gold_samples, record.group_size)
        record.gold = [None] * len(record)
        for i in rows:
            record.gold[i] = float(self.gold(problems[i], record.texts[i]))
        false_pass = sum(record.rewards[i] >= PASS > record.gold[i] for i in rows)  # type: ignore[operator]
        return {"monitor/gold_mean": sum(record.gold[i] for i in rows) / len(rows),  # type: ignore[misc]
                "monitor/proxy_mean": sum(record.rewards[i] for i in rows) / len(rows),
                "monitor/gold_false_pass": false_pass / len(rows)}

    def _audit(self, step: int, record: StepRecord, problems: list[Problem]) -> dict[str, float]:
        """Every `audit.every` steps (and at step 1): post a spread sample to each channel; every step: log
        the verdicts that have come back."""
        if not self.audits:
            return {}
        every = self.cfg.audit.every
        if step % every == 0 or step == 1:
            rows = spread(len(record), self.cfg.audit.samples, record.group_size)
            for channel in self.audits:
                channel.post(step, [problems[i] for i in rows], [record.texts[i] for i in rows],
                             [record.rewards[i] for i in rows])
        out: dict[str, float] = {}
        for channel in self.audits:
            if (batch := merge(channel.collect())) is not None:
                out.update(batch.metrics(channel.name))
        return out

    def close(self) -> None:
        """End what the audit channels started (a labelling app, labeller threads)."""
        for channel in self.audits:
            channel.close()

    def _write(self, record: StepRecord, alerts: list[Alert]) -> None:
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.cfg.samples_per_step:
            with (self.out_dir / SAMPLES_FILE).open("a") as f:
                for row in sample_rows(record, self.cfg.samples_per_step):
                    f.write(json.dumps(row, default=str) + "\n")
        if alerts:
            with (self.out_dir / ALERTS_FILE).open("a") as f:
                for a in alerts:
                    f.write(json.dumps(a.to_dict()) + "\n")
