"""Contended / quiet wall time of a short run, ours and TRL's: does a run share the cores fairly?

    python benchmarks/bench_contention.py [--repeats 1] [--trl]

The contender is one other PyTorch process with 2 intra-op threads doing matmuls without pause (what
a second worker, or a colleague's job, looks like). Each configuration runs once alone and once next
to the contender, in the same invocation; on a fair scheduler the contended run takes about twice as
long on a fully used machine. Ours: the demo recipe cut to 40 SFT + 10 GRPO steps (held-out eval of
100 problems before and after), `report.json`'s wall_seconds. TRL: 10 GRPO steps of bench_grpo.py's
TRL worker (tiny model, 64 completions of 16 tokens per step), summed step times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULT_TAG, STEP_TAG, ensure_model, load_average, provenance

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parent / "recipes" / "reverse_grpo.toml"
CONTENDER = ("import torch\ntorch.set_num_threads(2)\na = torch.randn(384, 384)\n"
             "while True:\n    a = torch.tanh(a @ a)\n")
# name -> (torch threads, extra environment)
CONFIGS: dict[str, tuple[int, dict[str, str]]] = {
    "2 threads, default wait": (2, {}),
    "2 threads, OMP_WAIT_POLICY=PASSIVE": (2, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "1 thread": (1, {}),
}


def env(threads: int, extra: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return {**base, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            **extra}


def ours(threads: int, extra: dict[str, str]) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-c", "from feedbackrl.cli import app; app()", "train", str(RECIPE), "--out", out,
               "--set", "sft.steps=40", "--set", "algo.steps=10", "--set", "eval.every=0",
               "--set", "task.heldout_size=100", "--set", f"train.threads={threads}"]
        subprocess.run(cmd, env=env(threads, extra), check=True, capture_output=True)
        return json.loads((Path(out) / "report.json").read_text())["wall_seconds"]


def trl(threads: int, extra: dict[str, str], model: Path, steps: int = 10) -> float:
    cmd = [sys.executable, str(HERE / "bench_grpo.py"), "trl", "--model", str(model), "--length", "16",
           "--steps", str(steps), "--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env(threads, extra))
    total = 0.0
    for line in proc.stdout:
        if line.startswith(STEP_TAG):
            row = json.loads(line[len(STEP_TAG):])
            total += row.get("step_s", 0.0)
            proc.stdin.write("go\n")
            proc.stdin.flush()
        elif line.startswith(RESULT_TAG):
            break
    proc.wait()
    return total


def measure(fn: Any, *args: Any) -> dict[str, float]:
    quiet = fn(*args)
    contender = subprocess.Popen([sys.executable, "-c", CONTENDER], env=env(2, {}))
    try:
        time.sleep(2.0)  # the contender has started its threads
        contended = fn(*args)
    finally:
        contender.kill()
        contender.wait()
    return {"quiet_s": quiet, "contended_s": contended, "ratio": contended / quiet}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trl", action="store_true", help="also the TRL rows (needs the bench extra)")
    ap.add_argument("--only", default="", help="run only the configurations whose name contains this")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for name, (threads, extra) in CONFIGS.items():
        if args.only not in name:
            continue
        row = {"framework": "feedbackrl", "config": name, "load_before": load_average()[0],
               **measure(ours, threads, extra)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        if args.trl:
            model = ensure_model(Path(tempfile.gettempdir()) / "feedbackrl-bench-models", "tiny")
            row = {"framework": "trl", "config": name, "load_before": load_average()[0],
                   **measure(trl, threads, extra, model)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    out = HERE / "results" / "contention.json"
    out.write_text(json.dumps({"provenance": provenance(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
