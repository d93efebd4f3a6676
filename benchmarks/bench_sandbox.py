"""Code sandbox overhead: ms per execution against a bare subprocess, and verdicts/s with a pool.

Run: .venv/bin/python benchmarks/bench_sandbox.py [--n 40] [--problems 48]
Prints a markdown table and writes benchmarks/results/sandbox.json.

Before and after a change, in one run: `--compare REV` exports the package as of git revision REV
to a temporary folder and measures it and the working tree in alternating worker processes
(`--rounds` each, medians), so both see the same machine load; writes
benchmarks/results/sandbox_compare.json.

"bare" is `subprocess.run([sys.executable, "-c", PROGRAM])` (site-packages and all) and "bare -I -S"
the same with the flags the sandbox uses, so the rest is isolation: unshare, the judge's mounts,
the fork and lock-down of the runner, the /proc sweep afterwards. One sandbox job runs all of a
problem's io tests (one runner each) or all its asserts (one runner), so the per-test cost falls
with more tests. Verdicts/s scores problems of 3 asserts with a gold program through
`CodeVerifier.batch` (a thread pool driving sandboxes) at several worker counts.
"""

from __future__ import annotations

import argparse
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


def compare(rev: str, n: int, n_problems: int, rounds: int) -> None:
    """Measure `rev` and the working tree in alternating worker processes; print and save a table."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", rev, "src/feedbackrl"], cwd=REPO, capture_output=True, check=True)
        tar_path = Path(tmp) / "old.tar"
        tar_path.write_bytes(archive.stdout)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        trees = {"before": Path(tmp) / "src", "after": REPO / "src"}
        runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for _ in range(rounds):
            for name, src in trees.items():
                out = subprocess.run([sys.executable, __file__, "--worker", "--n", str(n), "--problems",
                                      str(n_problems)], env={**os.environ, "PYTHONPATH": str(src)},
                                     capture_output=True, text=True, check=True)
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    table = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"cores: {os.cpu_count()}, {rounds} alternating rounds, median; before = {rev}, after = {head}\n")
    print(f"| row | before ({rev}) | after ({head}) | after / before |\n|---|---:|---:|---:|")
    for key in table["before"]:
        b, a = table["before"][key], table["after"][key]
        print(f"| {key} | {b:.1f} | {a:.1f} | {a / b:.2f}x |")
    COMPARE.parent.mkdir(exist_ok=True)
    COMPARE.write_text(json.dumps({"before": rev, "after": head, "rounds": rounds, "n_calls": n,
                                   "n_problems": n_problems, "cores": os.cpu_count(),
                                   "median": table, "runs": runs}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="timed calls per latency row")
    parser.add_argument("--problems", type=int, default=48, help="problems per throughput row")
    parser.add_argument("--compare", metavar="REV", help="also measure git revision REV, alternating with this tree")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per side with --compare")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.n, args.problems)))
        return
    if args.compare:
        compare(args.compare, args.n, args.problems, args.rounds)
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
    print(f"cores: {os.cpu_count()}, median of {args.n} calls\n")
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
        "n_calls": args.n, "n_problems": args.problems, "cores": os.cpu_count(),
        "python": platform.python_version(), "machine": platform.machine(),
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
