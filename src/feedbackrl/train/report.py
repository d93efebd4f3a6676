"""Human-facing results of any run: one printed summary and one plot, whatever the algorithm.

`print_report` shows the sections a report has (held-out evaluation before/after, the reward
model's held-out accuracy, the gold comparison against the starting policy, the online labelling
curve); `write_plot` draws what metrics.jsonl holds (training reward and hidden gold reward per RL
step with held-out accuracy; or the offline loss and reward-model accuracy; or held-out accuracy
against labels for the online labelling loop).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from feedbackrl.data.rows import read_jsonl
from feedbackrl.log import console
from feedbackrl.monitors.monitor import ALERTS_FILE
from feedbackrl.monitors.plot import mark_alerts


def _eval_table(report: dict[str, Any]) -> None:
    before, after = report.get("eval_before"), report.get("eval_after")
    shown = after or before
    if not shown:
        return
    table = Table(title=f"{report['task']} / {report['algo']}: held-out evaluation")
    table.add_column("metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    k = shown["k"]
    rows = [("accuracy", "greedy pass@1"), (f"pass@{k}", f"pass@{k}"), ("mean_len", "mean length")]
    if "truncated_frac" in shown:
        rows.append(("truncated_frac", "cut off at max_new_tokens"))
    if "finished_accuracy" in shown:
        rows.append(("finished_accuracy", "accuracy among finished answers"))
    for key, label in rows if k else [r for r in rows if r[0] != f"pass@{k}"]:
        b = f"{before[key]:.3f}" if before and before.get(key) is not None else "-"
        a = f"{after[key]:.3f}" if after and after.get(key) is not None else "-"
        table.add_row(label, b, a)
    console.print(table)


def print_report(report: dict[str, Any]) -> None:
    _eval_table(report)
    if "reward_model" in report:
        rm, ceiling = report["reward_model"], report["prefs"].get("heldout_ceiling", {})
        nan = float("nan")
        console.print(f"{report.get('kind', 'reward')} model: held-out pairwise accuracy "
                      f"{rm['rm/heldout_accuracy']:.3f} (ceiling from labeller noise: expected "
                      f"{ceiling.get('expected', nan):.3f}, realised {ceiling.get('realised', nan):.3f});"
                      f" agreement with gold {rm.get('rm/heldout_gold_agreement', nan):.3f}")
        if "rm/heldout_safety_accuracy" in rm:
            console.print(f"safe/unsafe accuracy on held-out responses {rm['rm/heldout_safety_accuracy']:.3f}")
    if report.get("no_gold"):
        console.print(report["no_gold"])
    if report.get("gold_vs_sft"):
        g = report["gold_vs_sft"]
        console.print(f"gold win rate vs SFT: sampled {g['win_rate']:.3f}, greedy {g['win_rate_greedy']:.3f};"
                      f" gold mean {g['baseline_gold_mean']:.3f} -> {g['gold_mean']:.3f};"
                      f" greedy accuracy {g['baseline_accuracy']:.3f} -> {g['accuracy']:.3f}")
    if "online" in report:
        o = report["online"]
        marks = ", ".join(f"{k.removeprefix('labels_to_')}: {v}" for k, v in o.items() if k.startswith("labels_to_"))
        console.print(f"{o['selection']}: held-out accuracy {o['final_accuracy']:.3f} after {o['labels']} labels "
                      f"(ceiling {o['heldout_ceiling']['expected']:.3f}); labels to reach {marks}")
    alerts = report.get("alerts") or {}
    if alerts.get("count"):
        by = ", ".join(f"{name} x{n}" for name, n in alerts["by_detector"].items())
        console.print(f"[yellow]monitors: {alerts['count']} alert(s), the first at step {alerts['first_step']} "
                      f"({by}); see alerts.jsonl or `feedbackrl monitor RUN_DIR`")
    if "safety_eval" in report:
        se = report["safety_eval"]
        console.print(f"held-out safety eval: mean cost {se['cost_mean']:.3f} (nonzero {se['cost_nonzero_frac']:.3f}), "
                      f"reward {se['reward_mean']:.3f} over {se['n']} sampled completions")
    if "release" in report:
        console.print(f"release: {report['release']['reason']}")
    console.print(f"wall time {report['wall_seconds']:.1f}s (training {report['train_seconds']:.1f}s)")


def _smooth(xs: list[float], window: int) -> list[float]:
    """Trailing moving average (shorter at the start)."""
    return [sum(xs[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(xs))]


def plot_proxy_vs_gold(runs: dict[str, Path], png_path: Path, title: str = "", window: int = 10,
                       alerts: list[dict[str, Any]] | None = None) -> None:
    """Training (proxy) reward and hidden gold reward per RL step for one or more runs' metrics.jsonl.

    Raw values are drawn faint, a `window`-step moving average bold; proxy solid, gold dashed; the
    monitors' `alerts` (rows of alerts.jsonl) as vertical lines at their steps.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (label, path) in enumerate(runs.items()):
        rl = [r for r in read_jsonl(path) if r.get("phase") == "rl"]
        steps, color = [r["step"] for r in rl], f"C{i}"
        for key, style, name in (("reward/mean", "-", "proxy"), ("reward/gold_mean", "--", "gold")):
            if rl and key in rl[0]:
                ys = [r[key] for r in rl]
                ax.plot(steps, ys, style, color=color, alpha=0.2, linewidth=0.8)
                ax.plot(steps, _smooth(ys, window), style, color=color, linewidth=2, label=f"{label}: {name}")
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"mean reward of the training batch ({window}-step average)")
    ax.set_ylim(-0.02, 1.02)
    mark_alerts(ax, alerts or [])
    _finish(fig, ax, png_path, title)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig: Any, ax: Any, png_path: Path, title: str) -> None:
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    _pyplot().close(fig)


def _draw_cost(ax: Any, rl: list[dict[str, Any]]) -> None:
    """[cost] and [constraint]: the batch's mean cost, the threshold, and lambda on its own axis at the right."""
    steps = [r["step"] for r in rl]
    ax.plot(steps, [r["cost/mean"] for r in rl], color="C3", alpha=0.6, label="train cost (mean)")
    if "constraint/lambda" in rl[0]:
        threshold = rl[0]["constraint/threshold"]
        target = rl[0]["constraint/cost_window_mean"] - rl[0]["constraint/violation"]
        ax.axhline(threshold, color="C3", linestyle=":", label=f"cost threshold {threshold:g}")
        if target != threshold:
            ax.axhline(target, color="C3", linestyle="-.", alpha=0.5, label=f"multiplier's target {target:.3g}")
        lam = ax.twinx()
        lam.plot(steps, [r["constraint/lambda"] for r in rl], color="C4", label="lambda (right axis)")
        lam.set_ylabel("Lagrange multiplier lambda")
        lam.legend(fontsize=8, loc="center right")


def _control_plot(rows: list[dict[str, Any]], png_path: Path, title: str) -> None:
    """A control run: the environment's return of the training episodes and of the greedy evaluations."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    rl = [r for r in rows if r.get("phase") == "rl" and r.get("episode/return") is not None]
    per_step = rows[0]["env_steps"] / max(rows[0]["step"], 1) if rows and "env_steps" in rows[0] else 0
    per_step = next((r["env_steps"] / r["step"] for r in rows if r.get("env_steps") and r["step"]), per_step)
    ax.plot([r["env_steps"] for r in rl], [r["episode/return"] for r in rl], label="training episodes (true return)")
    evals = [r for r in rows if r.get("phase") == "eval" or "eval/return" in r]
    ax.plot([r["step"] * per_step for r in evals], [r["eval/return"] for r in evals], "o-",
            label="greedy held-out episodes")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return (environment reward)")
    _finish(fig, ax, png_path, title)


def write_plot(metrics_path: Path, png_path: Path, title: str = "") -> None:
    """The run's curves.png, from its metrics.jsonl (see the module docstring)."""
    rows = read_jsonl(metrics_path)
    rl = [r for r in rows if r.get("phase") == "rl"]
    alerts_path = metrics_path.parent / ALERTS_FILE
    alerts = read_jsonl(alerts_path) if rl and alerts_path.is_file() else []
    if rl and "env_steps" in rl[0]:
        _control_plot(rows, png_path, title)
        return
    if rl and "reward/gold_mean" in rl[0]:
        plot_proxy_vs_gold({"this run": metrics_path}, png_path, title, alerts=alerts)
        return
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    online = [r for r in rows if r.get("phase") == "online"]
    if rl:
        evals = [r for r in rows if "eval/accuracy" in r]
        ax.plot([r["step"] for r in rl], [r["reward/mean"] for r in rl], label="train reward (mean)", alpha=0.6)
        ax.plot([r["step"] for r in evals], [r["eval/accuracy"] for r in evals], "o-",
                label="held-out accuracy (greedy)")
        ax.set_xlabel("RL step")
        ax.set_ylim(-0.02, 1.02)
        mark_alerts(ax, alerts)
        if "cost/mean" in rl[0]:
            _draw_cost(ax, rl)
    elif online:
        ax.plot([r["labels"] for r in online], [r["rm/heldout_accuracy"] for r in online], "o-",
                label="reward model: held-out pairwise accuracy")
        ax.set_xlabel("labels")
    else:
        keys = [k for k in ("loss/rm", "loss/pref") if any(k in r for r in rows)] or ["loss/sft"]
        for key in keys:  # the algorithm's own loss; SFT's when SFT is the algorithm
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=key)
        held = [(r["step"], r["rm/heldout_accuracy"]) for r in rows if "rm/heldout_accuracy" in r]
        if held:
            ax.plot(*zip(*held, strict=True), "o-", label="held-out pairwise accuracy")
        ax.set_xlabel("optimizer step")
    _finish(fig, ax, png_path, title)
