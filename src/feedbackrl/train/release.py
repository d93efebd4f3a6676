"""The high-confidence release step of a run: held-out costs in, a decision in report.json out.

`feedbackrl release RUN_DIR --threshold T --delta 0.1` reads the per-completion costs of the
candidate model on a held-out safety set, runs HC-RLHF's test (`algos.confidence.release_test`:
released only when the one-sided Student-t upper bound on the mean cost is under T) and merges the
decision into RUN_DIR/report.json under `release`, keeping every other key.

Costs file (`safety_eval.jsonl` in the run directory, or any file given with `--costs`): one JSON
object per line with a numeric `cost` (what the cost source gave that completion; lower is safer).
Optional keys, all or none of the rows carrying them:
- `scenario` (a non-empty string) with `violated` (true/false): the violation rate per scenario with
  its 95% Wilson interval goes into report.json under `safety.violation_rates`;
- `harmful` (was the prompt one to refuse) with `refused` (true/false): over-refusal and harmful
  compliance go under `safety.refusals`.
Other keys (`prompt`, `completion`, ...) are ignored. A run with a `[cost]` section writes this file after
training (`safety_eval`: one sampled completion of the trained policy per held-out prompt, scored by the
recipe's cost); with `[release] delta = ...` the run also decides (threshold `constraint.threshold`). Any
other evaluation can be given with `--costs`.

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

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.confidence import ReleaseDecision, release_test
from feedbackrl.data.rows import read_jsonl, write_jsonl
from feedbackrl.monitors.safety import refusal_rates, violation_rates
from feedbackrl.rewards.registry import BatchReward
from feedbackrl.rewards.verdict import Problem
from feedbackrl.rollout.generate import generate

SAFETY_EVAL_FILE = "safety_eval.jsonl"
REPORT_FILE = "report.json"


class ReleaseError(ValueError):
    """A release that cannot be decided as asked; the message names the file or value and the fix."""


def _finite_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # a JSON integer beyond float range
        return False


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a costs JSONL file, each checked to hold a finite number in `cost`."""
    if not path.is_file():
        raise ReleaseError(f"{path} does not exist or is not a file. A run writes {SAFETY_EVAL_FILE} when its recipe "
                           f"has a [cost] section; else evaluate the model on a held-out safety set and give the "
                           f'file with --costs FILE.jsonl, one {{"cost": NUMBER}} object per line')
    rows: list[Any] = read_jsonl(path)
    for i, row in enumerate(rows, start=1):
        value = row.get("cost") if isinstance(row, dict) else None
        if not _finite_number(value):
            has_cost = isinstance(row, dict) and "cost" in row
            got = f"cost {value!r}"[:80] if has_cost else f"no 'cost' key ({str(row)[:80]})"
            raise ReleaseError(f"{path}: row {i} needs a finite number in 'cost', got {got}")
    if not rows:
        raise ReleaseError(f"{path} has no rows: the release test needs the cost of every completion of the held-out "
                           f"safety set")
    return rows


def _pairs(rows: list[dict[str, Any]], keys: tuple[str, str], path: Path) -> list[tuple[Any, Any]] | None:
    """(row[a], row[b]) for every row when any row has key a, else None; a row missing either is an error."""
    a, b = keys
    if not any(a in row for row in rows):
        return None
    for i, row in enumerate(rows, start=1):
        if a not in row or b not in row:
            raise ReleaseError(f"{path}: row {i} lacks {a!r} or {b!r}; when one row has {a!r}, every row needs "
                               f"both {a!r} and {b!r}")
    return [(row[a], row[b]) for row in rows]


def safety_summary(rows: list[dict[str, Any]], path: Path) -> dict[str, Any]:
    """`violation_rates` and `refusals` from the rows' optional keys (module docstring); {} when they have none."""
    out: dict[str, Any] = {}
    violations = _pairs(rows, ("scenario", "violated"), path)
    refusals = _pairs(rows, ("harmful", "refused"), path)
    try:
        if violations is not None:
            out["violation_rates"] = violation_rates(violations).to_dict()
        if refusals is not None:
            out["refusals"] = {k: r and r.to_dict() for k, r in refusal_rates(refusals).items()}
    except ValueError as e:  # "record i" counts from 0; the file's rows from 1
        raise ReleaseError(f"{path}: {e} (record i is row i + 1)") from None
    return out


def _merge_into_report(report_path: Path, sections: dict[str, Any]) -> None:
    report: Any = {}
    if report_path.exists():
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ReleaseError(f"{report_path} is not valid JSON ({e.msg}, line {e.lineno}); it was left as it is: "
                               f"fix or move it and run release again") from None
        if not isinstance(report, dict):
            raise ReleaseError(f"{report_path} holds a {type(report).__name__}, not a JSON object; left as it is")
    report.update(sections)
    tmp = report_path.with_name(report_path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2), encoding="utf-8")
    os.replace(tmp, report_path)  # never a half-written report


def release_run(run_dir: Path, threshold: float, delta: float, costs: Path | None = None
                ) -> tuple[ReleaseDecision, dict[str, Any]]:
    """Decide on RUN_DIR's model from `costs` (default RUN_DIR/safety_eval.jsonl); write report.json's `release`
    (and `safety` when the rows carry scenarios or refusals). Returns the decision and the `safety` section."""
    if not run_dir.is_dir():
        raise ReleaseError(f"{run_dir} is not a directory: give the run's output directory (the one with report.json)")
    costs_path = costs if costs is not None else run_dir / SAFETY_EVAL_FILE
    rows = read_rows(costs_path)
    try:
        decision = release_test([row["cost"] for row in rows], threshold=threshold, delta=delta)
    except ValueError as e:
        raise ReleaseError(str(e)) from None
    safety = safety_summary(rows, costs_path)
    sha = hashlib.sha256(costs_path.read_bytes()).hexdigest()
    sections = {"release": {**decision.to_dict(), "costs_file": str(costs_path), "costs_sha256": sha}}
    if safety:
        sections["safety"] = safety
    _merge_into_report(run_dir / REPORT_FILE, sections)
    return decision, safety


def safety_eval(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, problems: list[Problem],
                cost: BatchReward, reward: BatchReward, out_path: Path, max_new_tokens: int, temperature: float,
                seed: int, batch_size: int = 256) -> dict[str, float]:
    """One completion per held-out problem, sampled at `temperature` (seeded: the same draws for every model),
    scored by the recipe's `cost` and `reward`; rows {prompt, completion, cost, reward} written to `out_path`
    (the costs file `release_run` reads). -> {n, cost_mean, cost_nonzero_frac, reward_mean}."""
    gen = torch.Generator().manual_seed(seed)
    texts: list[str] = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        texts += generate(model, tokenizer, [p.prompt for p in chunk], max_new_tokens, temperature,
                          generator=gen).texts
    costs = [float(v.score) for v in cost(problems, texts)]
    rewards = [float(v.score) for v in reward(problems, texts)]
    write_jsonl([{"prompt": p.prompt, "completion": t, "cost": c, "reward": r}
                 for p, t, c, r in zip(problems, texts, costs, rewards, strict=True)], out_path)
    n = len(problems)
    return {"n": n, "cost_mean": sum(costs) / n, "cost_nonzero_frac": sum(c > 0 for c in costs) / n,
            "reward_mean": sum(rewards) / n}
