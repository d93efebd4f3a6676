"""Collect control runs with a cost into one results file: the late training cost per step, the multiplier's
trajectory and the held-out metrics, per run directory.

Run: .venv/bin/python benchmarks/constraint_runs.py OUT.json NAME=RUN_DIR [NAME=RUN_DIR ...]
       [--section KEY] [--policy-cost POLICY_COST.json] [--command "HOW THE RUNS WERE MADE"]
each RUN_DIR written by `feedbackrl train RECIPE --out RUN_DIR --set train.seed=S [--set ...]`. Without
`--section` OUT.json is rewritten as {"provenance", "runs"}; with it, the runs go under OUT.json's KEY (with their
own provenance) and every other key of the file is kept. `--policy-cost` adds the file written by
benchmarks/policy_cost.py (each checkpoint's greedy and sampled cost per step over held-out episodes) under the
section's "policy_cost". `--command` records the command that trained the runs (e.g. `make highway-constraint`)
in the provenance, beside this script's own argv.

"Late training" is the last quarter of the updates, as in benchmarks/bench_control.py: the mean over those
updates of `cost/mean` (the rollout's cost per environment step) and of `episode/collision` (the share of
training episodes that ended in a crash) and, with `constraint.probe_envs`, of `constraint/probe_cost` (the current
policy's greedy cost per step on the probe environments, what the multiplier steps on) with the probes' CPU
seconds per update; held-out figures are report.json's `control_eval_after` (greedy,
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
        "lr_final": config["algo"].get("lr_final", 0.0),  # where the learning rate's annealing heads (0: to 0)
        "updates": len(rl), "late_updates": len(late),
        "late_training_cost_per_step": statistics.mean(r["cost/mean"] for r in late),
        "late_training_collision_rate": statistics.mean(r["episode/collision"] for r in late
                                                        if "episode/collision" in r),
        "late_training_return": statistics.mean(r["episode/return"] for r in late if "episode/return" in r),
        "cost_per_step_by_update": [r["cost/mean"] for r in rl],
        "entropy_by_update": [r["policy/entropy"] for r in rl],
        "late_entropy": statistics.mean(r["policy/entropy"] for r in late),
        "eval_after": report["control_eval_after"], "train_seconds": report.get("train_seconds"),
    }
    if rl and "constraint/lambda" in rl[0]:
        out["lambda_by_update"] = [r["constraint/lambda"] for r in rl]
        out["final_lambda"] = out["lambda_by_update"][-1]
        out["cost_window_mean_by_update"] = [r["constraint/cost_window_mean"] for r in rl]
    if rl and "constraint/probe_cost" in rl[0]:  # constraint.probe_envs: the greedy probe's cost, what J_C is over
        out["probe_cost_by_update"] = [r["constraint/probe_cost"] for r in rl]
        out["late_probe_cost_per_step"] = statistics.mean(r["constraint/probe_cost"] for r in late)
        out["probe_cpu_seconds_per_update"] = statistics.mean(r["perf/probe_cpu_s"] for r in rl)
        out["probe_wall_seconds_per_update"] = statistics.mean(r["perf/probe_s"] for r in rl)
        out["probe_cpu_seconds"] = sum(r["perf/probe_cpu_s"] for r in rl)
    return out


def main() -> None:
    args = sys.argv[1:]
    opts = {}
    for flag in ("--section", "--policy-cost", "--command"):
        if flag in args:
            i = args.index(flag)
            opts[flag] = args[i + 1]
            del args[i:i + 2]
    if len(args) < 2:
        raise SystemExit(__doc__)
    runs = {}
    for arg in args[1:]:
        name, _, path = arg.partition("=")
        runs[name] = one_run(Path(path))
        r = runs[name]
        print(f"{name}: seed {r['seed']}, late cost/step {r['late_training_cost_per_step']:.4f}, held-out collision "
              f"{r['eval_after']['eval/collision']:.2f}" + (f", final lambda {r['final_lambda']:.2f}"
                                                            if "final_lambda" in r else ""), flush=True)
    out = Path(args[0])
    measured: dict[str, Any] = {"provenance": provenance() | ({"command": opts["--command"]} if "--command" in opts
                                                              else {}), "runs": runs}
    if "--policy-cost" in opts:
        measured["policy_cost"] = json.loads(Path(opts["--policy-cost"]).read_text())
    if "--section" not in opts:
        out.write_text(json.dumps(measured, indent=2) + "\n")
        return
    kept = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps({**kept, opts["--section"]: measured}, indent=2) + "\n")


if __name__ == "__main__":
    main()
