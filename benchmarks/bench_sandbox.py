"""Code sandbox overhead: ms per execution against a bare subprocess, and verdicts/s with a pool.

Run: .venv/bin/python benchmarks/bench_sandbox.py [--n 40] [--problems 48]
Prints a markdown table and writes benchmarks/results/sandbox.json.

Before and after a change, in one run: `--compare REV [REV ...]` exports the package as of each
git revision to a temporary folder and measures them and the working tree in alternating worker
processes (`--rounds` each, medians), so all see the same machine load; writes
benchmarks/results/sandbox_compare.json (or `--out`). The per-test cost is the "1 io test" row: one verdict
of one io test, wall time, median. Both modes print the date, the commit, the CPU and its
vector instruction sets, and store them in the JSON.

"bare" is `subprocess.run([sys.executable, "-c", PROGRAM])` (site-packages and all) and "bare -I -S"
the same with the flags the sandbox uses, so the rest is isolation: unshare, the judge's mounts,
the fork and lock-down of the runner, the /proc sweep afterwards. One sandbox job runs all of a
problem's io tests (one runner each) or all its asserts (one runner), so the per-test cost falls
with more tests. Verdicts/s scores problems of 3 asserts with a gold program through
`CodeVerifier.batch` (a thread pool driving sandboxes) at several worker counts.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from feedbackrl.rewards.code import CodeVerifier
from feedbackrl.rewards.verdict import Problem

PROGRAM = "print(sum(range(10)))"
ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = {"asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"]}
RESULTS = Path(__file__).parent / "results" / "sandbox.json"
COMPARE = Path(__file__).parent / "results" / "sandbox_compare.json"
REPO = Path(__file__).resolve().parents[1]


def machine() -> dict[str, object]:
    """The date, the commit of the working tree and the CPU, for the results JSON and the printout."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    cpu, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text()
        cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), cpu)
        flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16") if f in flags]
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": head.strip() + ("+dirty" if dirty else ""), "cpu": cpu, "isa": isa, "cores": os.cpu_count(),
            "load_1min": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "kernel": platform.release()}


def print_machine(info: dict[str, object]) -> None:
    print(f"{info['date']}, commit {info['commit']}, {info['cores']}-core {info['cpu']} "
          f"({', '.join(info['isa']) or 'no AVX2'}), load {info['load_1min']}, Python {info['python']}")


def ms_per_call(call: Callable[[], object], n: int) -> float:
    """Median wall time of `n` calls, in ms (the median shrugs off other load on the machine)."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def verdicts_per_s(verifier: CodeVerifier, n_problems: int, workers: int) -> float:
    problems = [Problem("", ADD_TESTS)] * n_problems
    start = time.perf_counter()
    verdicts = verifier.batch(problems, [ADD] * n_problems, workers=workers)
    elapsed = time.perf_counter() - start
    assert all(v.score == 1.0 for v in verdicts), "the gold program must pass: the sandbox is broken"
    return n_problems / elapsed


def measure(n: int, n_problems: int) -> dict[str, float]:
    """The comparison's rows, for whichever feedbackrl is on sys.path."""
    verifier = CodeVerifier(timeout_s=5.0)
    io1 = Problem("", {"io": [{"input": "", "output": "45\n"}]})
    rows = {"1 io test, ms": ms_per_call(lambda: verifier(io1, PROGRAM), n),
            "3 asserts (one job), ms": ms_per_call(lambda: verifier(Problem("", ADD_TESTS), ADD), n)}
    for w in (1, 2):
        rows[f"verdicts/s, {w} worker{'s' * (w > 1)}"] = verdicts_per_s(verifier, n_problems, w)
    return rows


def compare(revs: list[str], n: int, n_problems: int, rounds: int, out: Path) -> None:
    """Measure each of `revs` and the working tree in alternating worker processes; print and save a table."""
    info = machine()
    after = f"tree {info['commit']}"
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for rev in revs:
            archive = subprocess.run(["git", "archive", rev, "src/feedbackrl"], cwd=REPO, capture_output=True,
                                     check=True)
            tar_path = Path(tmp) / f"{rev}.tar"
            tar_path.write_bytes(archive.stdout)
            with tarfile.open(tar_path) as tar:
                tar.extractall(Path(tmp) / rev, filter="data")
            trees[rev] = Path(tmp) / rev / "src"
        trees[after] = REPO / "src"
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for _ in range(rounds):
            for name, src in trees.items():
                proc = subprocess.run([sys.executable, __file__, "--worker", "--n", str(n), "--problems",
                                       str(n_problems)], env={**os.environ, "PYTHONPATH": str(src)},
                                      capture_output=True, text=True, check=True)
                runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    table = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    print_machine(info)
    print(f"{rounds} alternating rounds of {n} calls, medians; ratios against {revs[0]}\n")
    print("| row | " + " | ".join(trees) + " | " + " | ".join(f"{t} / {revs[0]}" for t in list(trees)[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(trees) - 1))
    for key in table[revs[0]]:
        values = [table[t][key] for t in trees]
        print(f"| {key} | " + " | ".join(f"{v:.1f}" for v in values) + " | "
              + " | ".join(f"{v / values[0]:.2f}x" for v in values[1:]) + " |")
    per_test = table[after]["1 io test, ms"]
    print(f"\nper-test cost (1 io test, median): {per_test:.1f} ms at {after}")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"revisions": list(trees), "machine": info, "rounds": rounds, "n_calls": n,
                                   "n_problems": n_problems, "per_test_ms": round(per_test, 1),
                                   "median": table, "runs": runs}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="timed calls per latency row")
    parser.add_argument("--problems", type=int, default=48, help="problems per throughput row")
    parser.add_argument("--compare", metavar="REV", nargs="+",
                        help="also measure these git revisions, alternating with this tree")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per side with --compare")
    parser.add_argument("--out", type=Path, default=COMPARE, help="results JSON of --compare")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.n, args.problems)))
        return
    if args.compare:
        compare(args.compare, args.n, args.problems, args.rounds, args.out)
        return

    verifier = CodeVerifier(timeout_s=5.0)
    io1 = Problem("", {"io": [{"input": "", "output": "45\n"}]})
    io10 = Problem("", {"io": [{"input": "", "output": "45\n"}] * 10})
    bare = ms_per_call(lambda: subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True), args.n)
    bare_is = ms_per_call(lambda: subprocess.run([sys.executable, "-I", "-S", "-c", PROGRAM],
                                                 capture_output=True), args.n)
    one = ms_per_call(lambda: verifier(io1, PROGRAM), args.n)
    ten = ms_per_call(lambda: verifier(io10, PROGRAM), max(args.n // 4, 5)) / 10
    asserts = ms_per_call(lambda: verifier(Problem("", ADD_TESTS), ADD), args.n)
    rates = {w: verdicts_per_s(verifier, args.problems, w) for w in (1, 2, 4, 8)}

    rows = [("bare `python -c`", bare), ("bare `python -I -S -c`", bare_is),
            ("sandbox, 1 io test", one), ("sandbox, per test of 10 io tests", ten),
            ("sandbox, 3 asserts (one job)", asserts)]
    info = machine()
    print_machine(info)
    print(f"median of {args.n} calls; per-test cost (1 io test): {one:.1f} ms\n")
    print("| execution | ms | vs bare |\n|---|---:|---:|")
    for name, ms in rows:
        print(f"| {name} | {ms:.1f} | {ms / bare:.2f}x |")
    print("\n| workers | verdicts/s (3 asserts each) |\n|---:|---:|")
    for w, r in rates.items():
        print(f"| {w} | {r:.1f} |")

    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "bare_ms": round(bare, 1), "bare_isolated_flags_ms": round(bare_is, 1),
        "sandbox_1_io_ms": round(one, 1), "sandbox_per_test_of_10_io_ms": round(ten, 1),
        "sandbox_3_asserts_ms": round(asserts, 1), "overhead_ms": round(one - bare, 1),
        "ratio_sandbox_over_bare": round(one / bare, 2),
        "verdicts_per_s_by_workers": {str(w): round(r, 1) for w, r in rates.items()},
        "n_calls": args.n, "n_problems": args.problems, "machine": info,
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
