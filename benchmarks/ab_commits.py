"""A GRPO step of feedbackrl at two source trees, in lock-step: did a change make training slower?

    git worktree add /tmp/before <commit>
    python benchmarks/ab_commits.py --before /tmp/before --after . [--model tiny|small|smollm2|DIR] [--length 16] \
        [--rollout-weights fp32|int8|bf16] [--out benchmarks/results/NAME.json]

Two bench_grpo.py workers (each tree's own script, its sources first on PYTHONPATH) take turns step
by step exactly as run.py's feedbackrl-vs-TRL rows do, so machine load hits both alike. Prints the
median step time of each and the ratio before/after (> 1: the after tree is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from common import ensure_model, provenance, summarize
from run import HERE, LockStepWorker, _stop, alternate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="checkout of the earlier commit")
    ap.add_argument("--after", type=Path, default=HERE.parent, help="checkout of the later commit")
    ap.add_argument("--model", default="tiny",
                    help="tiny or small (the benchmark's random Llamas), or a model dir, .gguf file or packaged name")
    ap.add_argument("--rollout-weights", choices=["fp32", "int8", "bf16"], default="fp32",
                    help="both sides' rollout.weights (training stays fp32)")
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timed", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, help="also write the result (with its provenance) to this JSON file")
    args = ap.parse_args()
    steps = args.warmup + args.timed
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if args.model in ("tiny", "small"):
            model = ensure_model(Path(tmp), args.model)
        else:
            from feedbackrl.models.load import resolve_model_path

            model = Path(resolve_model_path(args.model))
        workers = [LockStepWorker("feedbackrl", model, args.length, steps, args.threads,
                                  stack.enter_context(open(Path(tmp) / f"{name}.log", "w")), tree=tree.resolve(),
                                  name=name, rollout_weights=args.rollout_weights)
                   for name, tree in (("before", args.before), ("after", args.after))]
        stack.callback(_stop, workers)
        out, loads = alternate(workers, steps)
    step_s = {k: [r["step_s"] for r in v["steps"][args.warmup:]] for k, v in out.items()}
    cpu_s = {k: [r["cpu_s"] for r in v["steps"][args.warmup:]] for k, v in out.items()}
    med = {k: statistics.median(v) for k, v in step_s.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu_s.items()}
    per_step = [b / a for b, a in zip(step_s["before"], step_s["after"], strict=True)]
    commits = {name: commit(tree) for name, tree in (("before", args.before), ("after", args.after))}
    result = {"model": args.model, "length": args.length, "threads": args.threads, "commits": commits,
              "rollout_weights": args.rollout_weights, "median_step_s": med,
              "before_over_after": med["before"] / med["after"],
              "median_cpu_s": med_cpu, "cpu_before_over_after": med_cpu["before"] / med_cpu["after"],
              "steps": {k: v["steps"] for k, v in out.items()},
              "per_step_ratio": summarize(per_step), "load_1min": summarize(loads)}
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps({**result, "provenance": provenance()}, indent=1) + "\n")


def commit(tree: Path) -> str:
    """The checkout's commit (and "+dirty" when it has uncommitted changes to tracked files); for a tree that is
    not a checkout (a `git archive` of a commit), its directory's name."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return tree.resolve().name
    dirty = subprocess.run(["git", "-C", str(tree), "diff", "--quiet", "HEAD"], capture_output=True).returncode
    return head.stdout.strip() + ("+dirty" if dirty else "")


if __name__ == "__main__":
    main()
