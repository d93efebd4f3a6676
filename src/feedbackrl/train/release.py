"""The high-confidence release step of a run: held-out costs in, a decision in report.json out.

`feedbackrl release RUN_DIR --threshold T --delta 0.1` reads the per-completion costs of the
candidate model on a held-out safety set, runs HC-RLHF's test (`algos.confidence.release_test`:
released only when the one-sided Student-t upper bound on the mean cost is under T) and merges the
decision into RUN_DIR/report.json under `release`, keeping every other key.

Costs file (`safety_eval.jsonl` in the run directory, or any file given with `--costs`): one JSON
object per line with a numeric `cost` (what the cost source gave that completion; lower is safer).
Other keys are kept for other readers (`scenario`, `prompt`, `completion`, `violated`, ...). The run
path does not write this file yet: produce it with your own evaluation and pass it with `--costs`.

The decision records the costs file and its SHA-256, so a report says which evaluation it rests on.
A run resumed after `release` rewrites report.json at its end: run `release` again then.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from feedbackrl.algos.confidence import ReleaseDecision, release_test
from feedbackrl.data.rows import read_jsonl

SAFETY_EVAL_FILE = "safety_eval.jsonl"
REPORT_FILE = "report.json"


class ReleaseError(ValueError):
    """A release that cannot be decided as asked; the message names the file or value and the fix."""


def read_costs(path: Path) -> list[float]:
    """The `cost` of every row of a costs JSONL file (format in the module docstring)."""
    if not path.is_file():
        raise ReleaseError(f"{path} does not exist. Runs do not write {SAFETY_EVAL_FILE} yet: evaluate the model "
                           f"on a held-out safety set and give the file with --costs FILE.jsonl, one "
                           f'{{"cost": NUMBER}} object per line')
    rows: list[Any] = read_jsonl(path)
    costs = []
    for i, row in enumerate(rows, start=1):
        value = row.get("cost") if isinstance(row, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            got = f"cost {value!r}" if isinstance(row, dict) and "cost" in row else f"no 'cost' key ({str(row)[:80]})"
            raise ReleaseError(f"{path}: row {i} needs a finite number in 'cost', got {got}")
        costs.append(float(value))
    if not costs:
        raise ReleaseError(f"{path} has no rows: the release test needs the cost of every completion of the held-out "
                           f"safety set")
    return costs


def _merge_into_report(report_path: Path, section: dict[str, Any]) -> None:
    report: Any = {}
    if report_path.exists():
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ReleaseError(f"{report_path} is not valid JSON ({e.msg}, line {e.lineno}); it was left as it is: "
                               f"fix or move it and run release again") from None
        if not isinstance(report, dict):
            raise ReleaseError(f"{report_path} holds a {type(report).__name__}, not a JSON object; left as it is")
    report["release"] = section
    tmp = report_path.with_name(report_path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2), encoding="utf-8")
    os.replace(tmp, report_path)  # never a half-written report


def release_run(run_dir: Path, threshold: float, delta: float, costs: Path | None = None) -> ReleaseDecision:
    """Decide on RUN_DIR's model from `costs` (default RUN_DIR/safety_eval.jsonl); write report.json's `release`."""
    if not run_dir.is_dir():
        raise ReleaseError(f"{run_dir} is not a directory: give the run's output directory (the one with report.json)")
    costs_path = costs if costs is not None else run_dir / SAFETY_EVAL_FILE
    values = read_costs(costs_path)
    try:
        decision = release_test(values, threshold=threshold, delta=delta)
    except ValueError as e:
        raise ReleaseError(str(e)) from None
    sha = hashlib.sha256(costs_path.read_bytes()).hexdigest()
    _merge_into_report(run_dir / REPORT_FILE, {**decision.to_dict(), "costs_file": str(costs_path),
                                               "costs_sha256": sha})
    return decision
