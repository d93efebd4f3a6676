"""A GRPO step of feedbackrl at two source trees, in lock-step: did a change make training slower?

    git worktree add /tmp/before <commit>
    python benchmarks/ab_commits.py --before /tmp/before --after . [--model tiny|small] [--length 16]

Two bench_grpo.py workers (each tree's own script, its sources first on PYTHONPATH) take turns step
by step exactly as run.py's feedbackrl-vs-TRL rows do, so machine load hits both alike. Prints the
median step time of each and the ratio before/after (> 1: the after tree is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import RESULT_TAG, STEP_TAG, ensure_model, load_average, summarize

HERE = Path(__file__).resolve().parent


def worker(tree: Path, model: Path, length: int, steps: int, threads: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(tree / "benchmarks" / "bench_grpo.py"), "feedbackrl", "--model",
                             str(model), "--length", str(length), "--steps", str(steps), "--threads", str(threads)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env)


def read(proc: subprocess.Popen, tag: str) -> dict:
    for line in proc.stdout:
        if line.startswith(tag):
            return json.loads(line[len(tag):])
    raise RuntimeError(f"worker exited ({proc.wait()}) before {tag.strip()}")


def go(proc: subprocess.Popen, tag: str = STEP_TAG) -> dict:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return read(proc, tag)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="checkout of the earlier commit")
    ap.add_argument("--after", type=Path, default=HERE.parent, help="checkout of the later commit")
    ap.add_argument("--model", choices=["tiny", "small"], default="tiny")
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timed", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    steps = args.warmup + args.timed
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        model = ensure_model(Path(tmp), args.model)
        trees = {"before": args.before.resolve(), "after": args.after.resolve()}
        procs = {k: worker(t, model, args.length, steps, args.threads, Path(tmp) / f"{k}.log")
                 for k, t in trees.items()}
        stack.callback(lambda: [p.kill() for p in procs.values() if p.poll() is None])
        for p in procs.values():
            read(p, STEP_TAG)  # set-up, not timed
        rows: dict[str, list[float]] = {k: [] for k in procs}
        loads = []
        for step in range(steps):
            for k in (list(procs) if step % 2 == 0 else list(procs)[::-1]):
                rows[k].append(go(procs[k])["step_s"])
            loads.append(load_average()[0])
        for p in procs.values():
            go(p, RESULT_TAG)
    med = {k: statistics.median(v[args.warmup:]) for k, v in rows.items()}
    per_step = [b / a for b, a in zip(rows["before"][args.warmup:], rows["after"][args.warmup:], strict=True)]
    print(json.dumps({"model": args.model, "length": args.length, "threads": args.threads, "median_step_s": med,
                      "before_over_after": med["before"] / med["after"], "per_step_ratio": summarize(per_step),
                      "load_1min": summarize(loads)}, indent=2))


if __name__ == "__main__":
    main()
