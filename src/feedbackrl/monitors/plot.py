"""Alert markers for a training-curve plot: a dashed vertical line and a label per alert."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from feedbackrl.monitors.base import Alert

COLOURS = {"hacking": "tab:red", "health": "tab:orange"}


def mark_alerts(ax: Any, alerts: Sequence[Alert | dict[str, Any]], label: bool = True) -> int:
    """Draw each alert on a matplotlib axis whose x axis is the training step. Returns lines drawn.

    `alerts`: `Alert`s or their dicts (rows of `alerts.jsonl`). Hacking alerts are red, health orange.
    """
    for a in alerts:
        a = a.to_dict() if isinstance(a, Alert) else a
        ax.axvline(a["step"], color=COLOURS.get(a.get("kind", "hacking"), "tab:red"), linestyle="--",
                   linewidth=1, alpha=0.8)
        if label:
            ax.annotate(a["detector"], xy=(a["step"], 1.0), xycoords=("data", "axes fraction"), rotation=90,
                        va="top", ha="right", fontsize=7, color=COLOURS.get(a.get("kind", "hacking"), "tab:red"))
    return len(alerts)
