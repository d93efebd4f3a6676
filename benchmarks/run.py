"""feedbackrl vs TRL / HF generate, side by side on this CPU, in one invocation.

    python benchmarks/run.py            # everything (~10 min on an idle 2-core machine, < 30 min)
    python benchmarks/run.py --quick    # tiny + small at L=16, fewer steps (a few minutes)

Needs the `bench` extra for TRL: pip install -e '.[bench]'. Sections, each in fresh processes:

1. the machine's torch.mm GFLOP/s (fp32, bf16): the compute bound of every '% of bound' column;
2. generation, batch 64 x 128 new tokens, tiny and small: HF `model.generate` and our `generate`
   alternating in one process;
3. a GRPO step, tiny and small, L = 16 and 64: feedbackrl's `train_grpo` and TRL's `GRPOTrainer`
   in two processes (honest peak RSS each) that take turns step by step (benchmarks/bench_grpo.py);
4. a DPO step, tiny and small, 16 pairs: ours vs TRL's `DPOTrainer` (default, and with precomputed
   reference log-probs), interleaved repeats in one process (benchmarks/bench_preference.py).

Every ratio compares figures taken in the same run, interleaved, so machine load hits both sides;
the 1-minute load average is recorded per row. Writes benchmarks/results/perf[_quick].json and
.md; a full run also refreshes the table in docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from common import (
    RESULT_TAG,
    STEP_TAG,
    cpu_isa,
    cpu_name,
    ensure_model,
    flops_per_token,
    load_average,
    provenance,
    summarize,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DOC = HERE.parent / "docs" / "performance.md"
DOC_START, DOC_END = "<!-- bench:table:start -->", "<!-- bench:table:end -->"
GRPO_PROMPT_TOKENS = 6  # 'a+b=' with two-digit a, b
COMPLETIONS = 64
PROMPTS_PER_STEP = 8  # 8 prompts x 8 samples


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {load_average()[0]:.2f}] {msg}", flush=True)


def worker_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def run_worker(args: list[str], threads: int, logfile: IO[str]) -> dict[str, Any]:
    """Run `python benchmarks/<args>` to completion; returns its BENCH_RESULT json."""
    proc = subprocess.run([sys.executable, *args], stdout=subprocess.PIPE, stderr=logfile, text=True,
                          env=worker_env(threads), check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(f"worker {args} exited with {proc.returncode} and no result; see {logfile.name}")


class LockStepWorker:
    """A bench_grpo.py process driven one step at a time through its stdin/stdout.

    `tree`: another checkout to run instead of this one (its own bench_grpo.py, its sources first on
    PYTHONPATH), so two commits can be compared step by step (benchmarks/ab_commits.py).
    """

    def __init__(self, framework: str, model: Path, length: int, steps: int, threads: int, logfile: IO[str],
                 precision: str = "fp32", tree: Path | None = None, name: str | None = None,
                 rollout_weights: str = "fp32"):
        self.name = name or (framework if precision == "fp32" else f"{framework}_{precision}")
        if rollout_weights != "fp32" and name is None:
            self.name += f"_{rollout_weights}_rollouts"
        script, env = HERE / "bench_grpo.py", worker_env(threads)
        if tree is not None:
            script, env = tree / "benchmarks" / "bench_grpo.py", {**env, "PYTHONPATH": str(tree / "src")}
        # only non-default options are passed: older checkouts' bench_grpo.py has neither
        extra = [] if precision == "fp32" else ["--precision", precision]
        extra += [] if rollout_weights == "fp32" else ["--rollout-weights", rollout_weights]
        self.proc = subprocess.Popen(
            [sys.executable, str(script), framework, "--model", str(model), "--length", str(length),
             "--steps", str(steps), "--threads", str(threads), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logfile, text=True, env=env)
        self.logfile = logfile

    def read(self, tag: str) -> dict[str, Any]:
        for line in self.proc.stdout:  # skips whatever else the trainer prints
            if line.startswith(tag):
                return json.loads(line[len(tag):])
        raise RuntimeError(f"{self.name} worker exited ({self.proc.wait()}) before {tag.strip()}; "
                           f"see {self.logfile.name}")

    def go(self, tag: str = STEP_TAG) -> dict[str, Any]:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.read(tag)


def _stop(workers: list[LockStepWorker]) -> None:
    for w in workers:
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait()


def alternate(workers: list[LockStepWorker], steps: int) -> tuple[dict[str, dict[str, Any]], list[float]]:
    """Set the workers up (not timed), then `steps` steps each, taking turns (who goes first alternates
    too), so machine load hits every side alike. -> ({name: {"steps": rows, **final result}}, 1-min loads)."""
    for w in workers:  # model loading and trainer set-up, not timed
        w.read(STEP_TAG)
    rows: dict[str, list[dict[str, Any]]] = {w.name: [] for w in workers}
    loads = [load_average()[0]]
    for step in range(steps):
        for w in workers[:: 1 if step % 2 == 0 else -1]:
            rows[w.name].append(w.go())
        loads.append(load_average()[0])
    return {w.name: {"steps": rows[w.name], **w.go(RESULT_TAG)} for w in workers}, loads


def bench_grpo_pair(model: Path, length: int, warmup: int, timed: int, threads: int,
                    logdir: Path) -> dict[str, Any]:
    """Both frameworks, alternating step by step (who goes first alternates too)."""
    steps, names = warmup + timed, ("feedbackrl", "trl")
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(open(logdir / f"grpo_{model.name}_L{length}_{fw}.log", "w")) for fw in names]
        workers = [LockStepWorker(fw, model, length, steps, threads, f) for fw, f in zip(names, logs, strict=True)]
        stack.callback(_stop, workers)
        out, loads = alternate(workers, steps)
    for res in out.values():
        timed_rows = res["steps"][warmup:]
        step_s = [r["step_s"] for r in timed_rows]
        gen_s = [r["gen_s"] for r in timed_rows if r.get("gen_s") is not None]
        lens = [r["completion_len"] for r in timed_rows if r.get("completion_len") is not None]
        # peak RSS while training: at the last step, before anything the run does after training
        # (feedbackrl writes a final checkpoint; its serialisation buffers are not training memory)
        res["peak_rss_at_exit_mib"] = res.pop("peak_rss_mib")
        res["peak_rss_mib"] = res["steps"][-1]["peak_rss_mib"]
        res.update(step_s=summarize(step_s), cpu_s=summarize([r["cpu_s"] for r in timed_rows]),
                   gen_share=statistics.median(gen_s) / statistics.median(step_s) if gen_s else None,
                   completion_len_mean=statistics.mean(lens) if lens else None)
    ours, theirs = out["feedbackrl"], out["trl"]
    pairs = zip(ours["steps"][warmup:], theirs["steps"][warmup:], strict=True)
    per_step = [t["step_s"] / o["step_s"] for o, t in pairs]
    return {"model": model.name, "length": length, "warmup": warmup, "timed": timed, "load_1min": summarize(loads),
            "feedbackrl": ours, "trl": theirs, "speedup": theirs["step_s"]["median"] / ours["step_s"]["median"],
            "speedup_per_step": summarize(per_step)}


def versions() -> dict[str, str]:
    import torch
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import trl

        out["trl"] = trl.__version__
    except ImportError:
        out["trl"] = "not installed"
    return out


def plan(quick: bool) -> dict[str, Any]:
    if quick:
        return {"gen": [("tiny", 128, 2), ("small", 32, 2)], "grpo": [("tiny", 16, 1, 4), ("small", 16, 1, 3)],
                "dpo": [("tiny", 6, 1), ("small", 4, 1)]}
    return {"gen": [("tiny", 128, 3), ("small", 128, 3)],
            "grpo": [("tiny", 16, 2, 10), ("tiny", 64, 2, 10), ("small", 16, 2, 6), ("small", 64, 2, 5)],
            "dpo": [("tiny", 12, 3), ("small", 6, 2)]}  # (size, steps incl. 2 warm-up, repeats)


def run(args: argparse.Namespace) -> dict[str, Any]:
    p = plan(args.quick)
    out: dict[str, Any] = {"provenance": provenance(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                           "quick": args.quick, "threads": args.threads, "cpu": cpu_name(), "isa": cpu_isa(),
                           "cpu_count": os.cpu_count(),
                           "versions": versions(), "load_at_start": load_average()}
    logdir = Path(tempfile.mkdtemp(prefix="feedbackrl-bench-"))
    with tempfile.TemporaryDirectory() as tmp:  # the models (the small one is 110 MB) go when done
        models = {size: ensure_model(Path(tmp), size) for size in ("tiny", "small")}
        _run_sections(args, p, out, models, logdir)
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    out["load_at_end"] = load_average()
    return out


def _run_sections(args: argparse.Namespace, p: dict[str, Any], out: dict[str, Any], models: dict[str, Path],
                  logdir: Path) -> None:
    out["flops_per_token"] = {s: flops_per_token(m) for s, m in models.items()}
    log(f"worker logs in {logdir}")
    with open(logdir / "workers.log", "w") as wlog:
        out["matmul"] = run_worker([str(HERE / "bench_generate.py"), "matmul", "--threads", str(args.threads)]
                                   + (["--quick"] if args.quick else []), args.threads, wlog)
        log(f"matmul: fp32 {out['matmul']['best_fp32_gflops']:.0f} GFLOP/s, "
            f"bf16 {out['matmul']['best_bf16_gflops']:.0f} GFLOP/s")
        out["generate"] = []
        for size, new, repeats in p["gen"]:
            r = run_worker([str(HERE / "bench_generate.py"), "generate", "--model", str(models[size]),
                            "--threads", str(args.threads), "--new-tokens", str(new), "--repeats", str(repeats)],
                           args.threads, wlog)
            r["model"] = size
            out["generate"].append(r)
            tps = r["tokens_per_s"]
            log(f"generate {size} b64 x {new}: feedbackrl {tps['feedbackrl']['median']:.0f} tok/s, "
                f"HF {tps['hf']['median']:.0f} tok/s, ratio {statistics.median(r['ratio_per_repeat']):.2f}")
    out["grpo"] = []
    if out["versions"]["trl"] == "not installed":
        log("TRL is not installed (pip install -e '.[bench]'): GRPO comparison skipped")
    else:
        for size, length, warmup, timed in p["grpo"]:
            r = bench_grpo_pair(models[size], length, warmup, timed, args.threads, logdir)
            out["grpo"].append(r)
            log(f"grpo {size} L={length}: feedbackrl {r['feedbackrl']['step_s']['median']:.3f} s/step, "
                f"TRL {r['trl']['step_s']['median']:.3f} s/step, speedup {r['speedup']:.2f}x, RSS "
                f"{r['feedbackrl']['peak_rss_mib']:.0f} / {r['trl']['peak_rss_mib']:.0f} MiB")
        out["dpo"] = []
        with open(logdir / "dpo.log", "w") as dlog:
            for size, steps, repeats in p["dpo"]:
                before = load_average()
                r = run_worker([str(HERE / "bench_preference.py"), "--parts", "dpo", "--size", size,
                                "--model", str(models[size]), "--threads", str(args.threads), "--steps", str(steps),
                                "--warmup", "2", "--repeats", str(repeats), "--out", str(logdir / f"dpo_{size}.json")],
                               args.threads, dlog)
                r.update(model=size, load_before=before, load_after=load_average())
                out["dpo"].append(r)
                log(f"dpo {size}: ratio ours/TRL {r['ratio_ours_over_trl']['dpo']:.2f}x, "
                    f"vs TRL with precomputed reference {r['ratio_ours_over_trl']['dpo_vs_trl_precompute']:.2f}x")


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def markdown(res: dict[str, Any]) -> str:
    rate = res["matmul"]["best_fp32_gflops"] * 1e9
    fpt = res["flops_per_token"]
    v = res["versions"]
    lines = [
        f"Run {res['started']} ({'quick' if res['quick'] else 'full'}) at commit {res['provenance']['commit']}, "
        f"{res['cpu']} ({', '.join(res['isa']) or 'ISA unknown'}), {res['cpu_count']} cores, "
        f"torch threads {res['threads']}; torch {v['torch']}, transformers {v['transformers']}, trl {v['trl']}. "
        f"Load average (1 min) at start {res['load_at_start'][0]}, at end {res['load_at_end'][0]}.",
        f"Machine: torch.mm {res['matmul']['best_fp32_gflops']:.0f} GFLOP/s fp32, "
        f"{res['matmul']['best_bf16_gflops']:.0f} GFLOP/s bf16 (best median over sizes); "
        "'% of bound' = achieved model FLOPs / that fp32 rate; for our GRPO steps also the FLOPs executed, "
        "each group's shared prompt counted once.",
        "",
        "| row (fp32) | feedbackrl | baseline (TRL / HF) | speed ratio ours/theirs | % of fp32 bound ours / theirs "
        "| peak RSS MiB ours / theirs | load avg 1 min |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in res["generate"]:
        t = g["tokens_per_s"]
        ours, hf = t["feedbackrl"]["median"], t["hf"]["median"]
        bound = rate / g["flops_per_token"]
        lines.append(
            f"| generate {g['model']}, batch {g['batch']} x {g['new_tokens']} new: tok/s | {ours:,.0f} | {hf:,.0f} "
            f"| **{statistics.median(g['ratio_per_repeat']):.2f}x** | {pct(ours / bound)} / {pct(hf / bound)} | - "
            f"| {g['load_before'][0]} -> {g['load_after'][0]} |")
    for r in res["grpo"]:
        ours, trl = r["feedbackrl"], r["trl"]
        tokens = COMPLETIONS * (GRPO_PROMPT_TOKENS + r["length"])
        bound_s = tokens * 4 * fpt[r["model"]] / rate  # 2P generation + 6P training FLOPs per token
        # we run each group's shared prompt once (prefill and training forward): the FLOPs we execute
        executed = PROMPTS_PER_STEP * GRPO_PROMPT_TOKENS + COMPLETIONS * r["length"]
        exec_s = executed * 4 * fpt[r["model"]] / rate
        o, t = ours["step_s"]["median"], trl["step_s"]["median"]
        lines.append(
            f"| GRPO {r['model']}, 64 x L={r['length']}: s/step (completions/s) | {o:.3f} ({COMPLETIONS / o:.0f}) "
            f"| {t:.3f} ({COMPLETIONS / t:.0f}) | **{r['speedup']:.2f}x** "
            f"| {pct(bound_s / o)} ({pct(exec_s / o)} executed) / {pct(bound_s / t)} "
            f"| {ours['peak_rss_mib']:,.0f} / {trl['peak_rss_mib']:,.0f} "
            f"| {r['load_1min']['min']:.1f}-{r['load_1min']['max']:.1f} |")
    for r in res.get("dpo", []):
        sps = r["steps_per_s"]
        o, t, tp = 1 / sps["dpo/ours"], 1 / sps["dpo/trl"], 1 / sps["dpo/trl_precompute"]
        lines.append(
            f"| DPO {r['model']}, 16 pairs: s/step (vs TRL with precomputed reference) | {o:.3f} | {t:.3f} ({tp:.3f}) "
            f"| **{t / o:.2f}x** ({tp / o:.2f}x) | - | - (one process) "
            f"| {r['load_before'][0]} -> {r['load_after'][0]} |")
    if res["grpo"]:
        lines += ["", "GRPO detail: generated tokens/s (whole step), the share of the step spent generating, and "
                  "the speed ratio from CPU seconds per step (less sensitive to other processes than wall time).", "",
                  "| row | gen tok/s ours / TRL | generation share ours / TRL | mean completion length ours / TRL "
                  "| per-step speed ratio median (min-max) | CPU-time ratio |", "|---|---|---|---|---|---|"]
        for r in res["grpo"]:
            ours, trl = r["feedbackrl"], r["trl"]
            gt = [COMPLETIONS * r["length"] / x["step_s"]["median"] for x in (ours, trl)]
            sh = [f"{x['gen_share']:.0%}" if x["gen_share"] is not None else "-" for x in (ours, trl)]
            ln = [f"{x['completion_len_mean']:.1f}" if x["completion_len_mean"] is not None else "-"
                  for x in (ours, trl)]
            s = r["speedup_per_step"]
            cpu = trl["cpu_s"]["median"] / ours["cpu_s"]["median"]
            lines.append(f"| GRPO {r['model']} L={r['length']} | {gt[0]:,.0f} / {gt[1]:,.0f} | {sh[0]} / {sh[1]} "
                         f"| {ln[0]} / {ln[1]} | {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) | {cpu:.2f}x |")
    return "\n".join(lines) + "\n"


def update_doc(table: str, command: str) -> None:
    if not DOC.exists():
        return
    text = DOC.read_text()
    if DOC_START not in text or DOC_END not in text:
        return
    head, rest = text.split(DOC_START, 1)
    _, tail = rest.split(DOC_END, 1)
    DOC.write_text(f"{head}{DOC_START}\n`{command}`\n\n{table}{DOC_END}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny + small at L=16, fewer steps: a few minutes")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch threads in every worker (default: all cores, as the TRL baseline)")
    args = ap.parse_args()
    log(f"benchmark ({'quick' if args.quick else 'full'}), {args.threads} threads")
    if load_average()[0] > 0.5 and args.threads > 1:
        log("warning: the machine is busy; with every core in use, intra-op threads that wait on each other "
            "slow op-heavy code (HF, TRL) far more than ours. Prefer --threads 1 on a shared machine.")
    res = run(args)
    stem = "perf_quick" if args.quick else "perf"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(res, indent=1))
    table = markdown(res)
    (RESULTS / f"{stem}.md").write_text(table)
    if not args.quick:
        update_doc(table, "python benchmarks/run.py" + (f" --threads {args.threads}" if args.threads != os.cpu_count()
                                                         else ""))
    print(table)


if __name__ == "__main__":
    main()
