"""The monitors' section of a run's report.json, read from the run dir's alerts.jsonl."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from feedbackrl.data.rows import read_jsonl
from feedbackrl.monitors.monitor import ALERTS_FILE


def alerts_section(run_dir: str | Path) -> dict[str, Any]:
    """{"count", "first_step", "by_detector": {name: count}, "actions": {action: count}, "alerts": [...]}.

    A run without alerts (or trained with the monitors off) gives count 0 and first_step None.
    """
    path = Path(run_dir) / ALERTS_FILE
    alerts = read_jsonl(path) if path.is_file() else []
    return {"count": len(alerts), "first_step": min((a["step"] for a in alerts), default=None),
            "by_detector": dict(Counter(a["detector"] for a in alerts)),
            "actions": dict(Counter(a.get("action", "log") for a in alerts)), "alerts": alerts}
