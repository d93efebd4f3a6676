"""Shared pieces of the speed benchmarks: the models, the GRPO toy task, FLOP counts, worker plumbing.

Everything here mirrors the TRL CPU baseline's scripts (bench_trl.py, make_tiny_model.py) so that
feedbackrl and TRL see the same models, tokenizer, prompts, reward and hyperparameters.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feedbackrl.envs.base import Task
from feedbackrl.rewards.verdict import Problem, Verdict

RESULT_TAG = "BENCH_RESULT "  # a worker's last stdout line: this tag, then its JSON result
STEP_TAG = "BENCH_STEP "  # lock-step GRPO workers: one line per finished step


# the CPU flags that decide which matmul and attention kernels torch picks (and so the rounding of float results)
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "asimd", "sve")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_isa() -> list[str]:
    """Which of ISA_FLAGS this CPU has, from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return [f for f in ISA_FLAGS if f in have]
    except OSError:
        pass
    return []


# settings that narrow the vector paths of PyTorch, its libraries and our C kernel (an emulated, narrower CPU)
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS",
              "FEEDBACKRL_NATIVE_MARCH")


def isa_limits() -> dict[str, str]:
    """Which of ISA_LIMITS are set: a run with any of them emulates a narrower CPU and must say so."""
    return {k: os.environ[k] for k in ISA_LIMITS if os.environ.get(k)}


def isa_label() -> str:
    """The CPU's instruction set as one label for every ratio, with the emulation settings where any are set."""
    import torch

    isa = ", ".join(cpu_isa()) or "unknown ISA"
    limits = " ".join(f"{k}={v}" for k, v in isa_limits().items())
    emulated = f"; EMULATED, limited by {limits}" if limits else ""
    return f"{isa}; torch {torch.__version__}, ATen {torch.backends.cpu.get_cpu_capability()}{emulated}"


def machine() -> str:
    """One line for a results row: cores, CPU model and its vector instruction set, e.g.
    '2-core AMD EPYC (avx2)'."""
    isa = ", ".join(cpu_isa()) or "unknown ISA"
    return f"{os.cpu_count()}-core {cpu_name()} ({isa})"


def git_commit() -> str:
    """The checked-out commit, '+dirty' when tracked files differ from it; 'unknown' outside a checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def provenance() -> dict[str, Any]:
    """Where a result came from; every results JSON carries it under "provenance"."""
    import torch

    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
            "machine": machine(), "cpu": cpu_name(), "isa": cpu_isa(), "isa_limits": isa_limits(),
            "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "argv": sys.argv,
            "load_average": load_average()}


def summarize(xs: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs), "values": xs}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def setup_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def ensure_model(root: Path, size: str) -> Path:
    """The baseline's random Llama (seed 0) and char tokenizer, built once under `root`."""
    from feedbackrl.models.tiny import make_tiny

    out = root / size
    if not (out / "config.json").exists():
        make_tiny(out, size=size, seed=0)
    return out


def flops_per_token(model_dir: Path) -> float:
    """Forward FLOPs per token, 2 x matmul parameters; the tied lm_head counts once (as the baseline)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_dir)
    d, f, layers, v = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    kv = c.num_key_value_heads * (d // c.num_attention_heads)
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * f + 2 * d  # q, o, k, v, mlp, two norms
    non_embedding = layers * per_layer + d  # + the final norm
    return 2.0 * (non_embedding + v * d)


def gen_prompts(n: int, seed: int = 0) -> list[str]:
    """12-character (= 12-token) prompts such as '123+456+789=': no padding (baseline's make_gen_prompts)."""
    rng = random.Random(seed)
    return [f"{rng.randint(100, 999)}+{rng.randint(100, 999)}+{rng.randint(100, 999)}=" for _ in range(n)]


@dataclass
class SumTask(Task):
    """The baseline's GRPO task: 'a+b=' with a, b in 10..99; reward 1 if the completion starts with a+b.

    Same prompt distribution and reward as bench_trl.py's `make_grpo_dataset` and `sum_reward`.
    """

    name: str = "bench_sum"

    def sample(self, rng: random.Random) -> Problem:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b))

    def heldout(self, n: int) -> list[Problem]:
        return [self.sample(random.Random(10_000 + i)) for i in range(n)]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        ok = completion.strip().startswith(problem.answer)
        return Verdict(1.0 if ok else 0.0, ok, "starts with the sum" if ok else "does not start with the sum")


def sum_dataset(n: int, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"prompt": p.prompt, "answer": p.answer} for p in (SumTask().sample(rng) for _ in range(n))]


def sum_reward(completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function identical to SumTask.verify (and to the baseline's sum_reward)."""
    return [1.0 if c.strip().startswith(a) else 0.0 for c, a in zip(completions, answer, strict=True)]


def emit(tag: str, payload: dict[str, Any]) -> None:
    sys.stdout.write(tag + json.dumps(payload) + "\n")
    sys.stdout.flush()
