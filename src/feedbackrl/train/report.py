"""Human-facing results: the before/after table and the reward/accuracy plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from feedbackrl.log import console, read_jsonl


def print_report(report: dict[str, Any]) -> None:
    before, after = report.get("eval_before"), report["eval_after"]
    table = Table(title=f"{report['task']} / {report['algo']}: held-out evaluation")
    table.add_column("metric")
    table.add_column("before RL", justify="right")
    table.add_column("after RL", justify="right")
    k = after["k"]
    for key, label in (("accuracy", "greedy pass@1"), (f"pass@{k}", f"pass@{k}"), ("mean_len", "mean length")):
        b = f"{before[key]:.3f}" if before else "-"
        table.add_row(label, b, f"{after[key]:.3f}")
    console.print(table)
    console.print(f"wall time {report['wall_seconds']:.1f}s (RL {report['rl_seconds']:.1f}s)")


def write_plot(metrics_path: Path, png_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(metrics_path)
    rl = [r for r in rows if r.get("phase") == "rl"]
    evals = [r for r in rows if "eval/accuracy" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in rl], [r["reward/mean"] for r in rl], label="train reward (mean)", alpha=0.6)
    ax.plot([r["step"] for r in evals], [r["eval/accuracy"] for r in evals], "o-", label="held-out accuracy (greedy)")
    ax.set_xlabel("RL step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
