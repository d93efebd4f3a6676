"""Audit a finished run: its `metrics.jsonl` and `samples.jsonl` through the detectors again.

Steps whose metrics already carry the monitor's `monitor/*` statistics (a run trained with the
monitor on) are checked on those, so the replay gives the live run's alerts; older runs are
measured on the completions in `samples.jsonl` (a few per step, so their statistics are noisier).
Actions are not replayed: a replay only reports.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from feedbackrl.config import MonitorsConfig
from feedbackrl.data.rows import DatasetError, read_jsonl, read_text
from feedbackrl.monitors.base import Alert
from feedbackrl.monitors.monitor import SAMPLES_FILE, Monitor
from feedbackrl.monitors.record import StepRecord


def run_monitors_config(run_dir: Path) -> MonitorsConfig:
    """The `[monitors]` section the run was trained with (its config.json), else the defaults."""
    path = run_dir / "config.json"
    if not path.is_file():
        return MonitorsConfig()
    try:
        data = json.loads(read_text(path))
        return MonitorsConfig.model_validate(data.get("monitors", {}) if isinstance(data, dict) else {})
    except ValueError as e:  # not JSON, or a [monitors] section that does not validate (pydantic's error)
        raise DatasetError(f"{path}: not a run's config ({str(e).splitlines()[0]})") from None


def training_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The RL steps of `metrics.jsonl` (eval and SFT rows dropped), one per step, the last one kept."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise DatasetError(f"{path} does not exist: is {str(run_dir)!r} a run directory?")
    rows = {}
    for i, r in enumerate(read_jsonl(path)):
        if not isinstance(r, dict) or not isinstance(r.get("step", 0), int):
            raise DatasetError(f"{path}: row {i} is not a metrics row (an object with an integer 'step')")
        if r.get("phase", "rl") == "rl" and "step" in r:
            rows[r["step"]] = r
    return [rows[s] for s in sorted(rows)]


def replay(run_dir: str | Path, cfg: MonitorsConfig | None = None) -> list[Alert]:
    """The alerts the detectors raise over a finished run's logs."""
    run_dir = Path(run_dir)
    cfg = cfg or run_monitors_config(run_dir)
    samples: dict[int, list[dict[str, Any]]] = defaultdict(list)
    if (run_dir / SAMPLES_FILE).is_file():
        for i, row in enumerate(read_jsonl(run_dir / SAMPLES_FILE)):
            if not (isinstance(row, dict) and isinstance(row.get("step"), int)):
                raise DatasetError(f"{run_dir / SAMPLES_FILE}: row {i} is not a sample row (an object with an "
                                   "integer 'step')")
            samples[row["step"]].append(row)
    monitor = Monitor(cfg)
    for row in training_rows(run_dir):
        step = row["step"]
        record = StepRecord.from_samples(step, samples.get(step, []))
        measured: dict[str, float] = {}
        if record.texts:
            for d in monitor.detectors:
                measured.update(d.measure(record))
        monitor.observe(step, record, {**measured, **row})  # logged statistics win over re-measured ones
    return monitor.alerts
