"""Collect control runs with a cost into one results file: the late training cost per step, the multiplier's
trajectory and the held-out metrics, per run directory.

Run: .venv/bin/python benchmarks/constraint_runs.py OUT.json NAME=RUN_DIR [NAME=RUN_DIR ...]
each RUN_DIR written by `feedbackrl train RECIPE --out RUN_DIR --set train.seed=S [--set ...]`.

"Late training" is the last quarter of the updates, as in benchmarks/bench_control.py: the mean over those
updates of `cost/mean` (the rollout's cost per environment step) and of `episode/collision` (the share of
training episodes that ended in a crash); held-out figures are report.json's `control_eval_after` (greedy,
`control.eval_episodes` episodes).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance  # noqa: E402


def one_run(run_dir: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    late = rl[len(rl) * 3 // 4:]
    config = json.loads((run_dir / "config.json").read_text())
    report = json.loads((run_dir / "report.json").read_text())
    out: dict[str, Any] = {
        "run_dir": str(run_dir), "seed": config["train"]["seed"], "constraint": config.get("constraint"),
        "updates": len(rl), "late_updates": len(late),
        "late_training_cost_per_step": statistics.mean(r["cost/mean"] for r in late),
        "late_training_collision_rate": statistics.mean(r["episode/collision"] for r in late
                                                        if "episode/collision" in r),
        "late_training_return": statistics.mean(r["episode/return"] for r in late if "episode/return" in r),
        "cost_per_step_by_update": [r["cost/mean"] for r in rl],
        "eval_after": report["control_eval_after"], "train_seconds": report.get("train_seconds"),
    }
    if rl and "constraint/lambda" in rl[0]:
        out["lambda_by_update"] = [r["constraint/lambda"] for r in rl]
        out["final_lambda"] = out["lambda_by_update"][-1]
    return out


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    runs = {}
    for arg in sys.argv[2:]:
        name, _, path = arg.partition("=")
        runs[name] = one_run(Path(path))
        r = runs[name]
        print(f"{name}: seed {r['seed']}, late cost/step {r['late_training_cost_per_step']:.4f}, held-out collision "
              f"{r['eval_after']['eval/collision']:.2f}" + (f", final lambda {r['final_lambda']:.2f}"
                                                            if "final_lambda" in r else ""), flush=True)
    Path(sys.argv[1]).write_text(json.dumps({"provenance": provenance(), "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
