"""How far the multiplier's probe window lags the final policy (docs/safety.md, the AMX table).

    python examples/safe_probe_lag.py runs/safe_demo 3 7

For each seed: the constrained run's probe set (drawn again as the run drew it, `train/probe.py`), its final
checkpoint sampled four times on every probe word at the rollout temperature, against the mean of the probe
costs its last 8 steps logged (with the recipe's 125 of 1,000 a step: every probe word once, the window J_C is
over at the end). One thread.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from feedbackrl.config import load_config
from feedbackrl.envs.registry import make_task
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.rollout.generate import generate
from feedbackrl.train.probe import ProbeSet

RECIPE = Path("recipes/reverse_safe_grpo.toml")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="examples/safe_demo.py's --out")
    p.add_argument("seeds", type=int, nargs="+")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(RECIPE)
    task = make_task(cfg.task)
    ro = cfg.rollout
    for seed in args.seeds:
        run = args.out / f"safe_seed{seed}"
        ckpt = sorted((run / "checkpoints").iterdir())[-1]
        probes = ProbeSet.draw(task, cfg.constraint, seed).problems
        model, tokenizer = load_policy(str(ckpt)), load_tokenizer(str(ckpt))
        gen, costly, n = torch.Generator().manual_seed(7), 0, 0
        for _ in range(4):
            for i in range(0, len(probes), 250):
                out = generate(model, tokenizer, [q.prompt for q in probes[i : i + 250]], ro.max_new_tokens,
                               ro.temperature, generator=gen)
                costly += sum("a" in t for t in out.texts)
                n += len(out.texts)
        rl = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        rl = [r for r in rl if r.get("phase") == "rl"]
        window = sum(r["constraint/probe_cost"] for r in rl[-8:]) / 8
        print(f"seed {seed}: final policy on its probe set {costly / n:.4f} (4 draws); the probe costs of the "
              f"last 8 steps {window:.4f}; lag {costly / n - window:+.4f}")


if __name__ == "__main__":
    main()
