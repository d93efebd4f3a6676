"""The SmolLM2 calculator comparison (`make smollm2-tools`) as one results file.

Reads the base model's evaluations (`feedbackrl eval smollm2 --recipe R --out FILE`, one per arm) and the two
runs' `eval_before.json` (after SFT) and `report.json` (after GRPO), and writes, per arm and stage, greedy
held-out accuracy, tool calls per episode, malformed calls per episode, the tool error rate and the episode end
kinds, and each GRPO step's sampled pass rate and calls, with the run's provenance. Nothing here is a
measurement of its own.

    python benchmarks/smollm2_tools_summary.py --runs runs/smollm2_tools \
        --out benchmarks/results/smollm2_calculator_grpo.json --commit HASH [--machine "..."]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from pathlib import Path

KEYS = ("accuracy", "episode/tool_calls_mean", "episode/parse_errors_mean", "episode/tool_error_rate",
        "episode/turns_mean", "episode/end/answered", "episode/end/truncated", "episode/end/out_of_turns",
        "mean_len")


def stage(result: dict) -> dict:
    """The readings of one evaluation, with the binomial standard error of its accuracy."""
    out = {k.removeprefix("episode/"): result[k] for k in KEYS if k in result}
    p, n = result["accuracy"], result["n"]
    out["n"] = n
    out["se_accuracy"] = round(math.sqrt(p * (1 - p) / n), 3)
    out["samples"] = [s["completion"][:200] for s in result.get("samples", [])[:3]]
    return out


def arm(runs: Path, name: str) -> dict:
    report = json.loads((runs / name / "report.json").read_text())
    return {"base": stage(json.loads((runs / f"{name}_base.json").read_text())),  # `feedbackrl eval smollm2`
            "after_sft": stage(json.loads((runs / name / "eval_before.json").read_text())),
            "after_grpo": stage(report["eval_after"]),
            "train_steps": train_steps(runs / name / "metrics.jsonl"),
            "wall_s": round(report["wall_seconds"], 1), "train_s": round(report["train_seconds"], 1)}


def train_steps(path: Path) -> list[dict]:
    """Per GRPO step: the sampled episodes' pass rate, tool calls and malformed calls per episode, step time."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    keys = {"reward/pass_rate": "pass_rate", "episode/tool_calls_mean": "tool_calls_mean",
            "episode/parse_errors_mean": "parse_errors_mean", "perf/step_s": "step_s"}
    return [{"step": r["step"], **{v: round(r[k], 3) for k, v in keys.items() if k in r}}
            for r in rows if r.get("phase") == "rl"]


def cpu_in_words() -> str:
    """lscpu's model name, core count and the instruction sets the rollout paths use."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    isa = ("AMX" if "amx_bf16" in flags else "AVX-512 with BF16, no AMX" if "avx512_bf16" in flags
           else "AVX-512, no BF16" if "avx512f" in flags else "AVX2 only" if "avx2" in flags else "no AVX2")
    return f"{fields.get('CPU(s)', '?').strip()}-core {fields.get('Model name', '?').strip()}, {isa}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=Path("runs/smollm2_tools"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/smollm2_calculator_grpo.json"))
    ap.add_argument("--machine", default="", help="the CPU in words (default: lscpu's model name and flags)")
    ap.add_argument("--commit", required=True, help="the commit of the code that ran")
    ap.add_argument("--date", default="")
    ap.add_argument("--note", default="")
    ap.add_argument("--extra", action="append", default=[], metavar="LABEL=FILE",
                    help="a further `feedbackrl eval` result to include under `extra`, e.g. the GRPO checkpoint "
                         "on other digit counts")
    a = ap.parse_args()
    a.machine = a.machine or cpu_in_words()
    result = {
        "provenance": {"machine": a.machine, "commit": a.commit, "date": a.date, "threads": 1, "OMP_NUM_THREADS": 1,
                       "command": "make smollm2-tools", "seed": 0, "note": a.note},
        "recipes": {"tool": "recipes/smollm2_calculator_grpo.toml",
                    "no_tool": "recipes/smollm2_calculator_notool_grpo.toml"},
        "tool": arm(a.runs, "tool"),
        "no_tool": arm(a.runs, "notool"),
    }
    for item in a.extra:
        label, _, path = item.partition("=")
        result.setdefault("extra", {})[label] = stage(json.loads(Path(path).read_text()))
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    for name in ("tool", "no_tool"):
        for s in ("base", "after_sft", "after_grpo"):
            r = result[name][s]
            print(f"{name:8s} {s:10s} accuracy {r['accuracy']:.3f}  tool calls/episode {r['tool_calls_mean']:.2f}  "
                  f"malformed/episode {r.get('parse_errors_mean', float('nan')):.2f}")


if __name__ == "__main__":
    main()
