"""Seeded short runs of both on-policy loops at one source tree: did a refactor change what training produces?

    git clone --shared . ../before && git -C ../before checkout <commit>
    PYTHONPATH=../before/src python benchmarks/same_outputs.py --out before.json
    PYTHONPATH=src python benchmarks/same_outputs.py --out after.json
    python benchmarks/same_outputs.py --compare before.json after.json [--out benchmarks/results/NAME.json]

The runs, each a few seconds on one CPU thread: CartPole PPO (`control_ppo`) with the environment's reward, with
a reward learned from simulated preferences, with PPO-Lagrangian on a cost, and with a planted reward model whose
`proxy_gold` alert stops the run; GRPO on the tiny model with a monitor that rolls back at every step and one that
stops at the first, and PPO. Each run's record: every logged value except timings (`perf/*`, `*seconds*`), the
control report, the checkpoints written and a hash of the final policy weights. `--compare` says, run by run,
whether two records are equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance  # noqa: E402

TIMINGS = ("perf/", "seconds")


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items() if not any(t in k for t in TIMINGS)}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def _digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _control(data: dict[str, Any], out: Path) -> dict[str, Any]:
    from feedbackrl.config import build_config
    from feedbackrl.control.loop import load_checkpoint
    from feedbackrl.train.run import run

    report = run(build_config(data), out)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    policy, _ = load_checkpoint(out / "checkpoints" / ckpts[-1])
    return {"rows": _clean(rows), "report": _clean(report), "checkpoints": ckpts,
            "policy": _digest(policy.state_dict())}


def _cartpole(steps: int, **control: Any) -> dict[str, Any]:
    return {"algo": {"name": "control_ppo", "steps": steps},
            "control": {"env": "CartPole-v1", "num_envs": 4, "rollout_steps": 128, **control},
            "train": {"threads": 1, "checkpoint_every": 2}}


def control_runs(root: Path) -> dict[str, Any]:
    prefs = {"segment_len": 16, "labels": 24, "rounds": 3, "epochs": 5}
    lagrangian = {**_cartpole(4, cost="cart_off_centre"), "constraint": {"threshold": 0.01, "window": 8}}
    # a teacher who flips every label: the learned reward rises while the true return falls, proxy_gold stops it
    planted = _cartpole(8, reward="preferences", eval_episodes=2, preferences={
        "segment_len": 25, "labels": 160, "rounds": 4, "epochs": 40, "teacher": {"mistake": 1.0, "equal_within": 0.5}})
    planted["monitors"] = {"actions": {"proxy_gold": "stop"}}
    return {"control_env": _control(_cartpole(4), root / "env"),
            "control_prefs": _control(_cartpole(4, reward="preferences", preferences=prefs), root / "prefs"),
            "control_lagrangian": _control(lagrangian, root / "lagrangian"),
            "control_monitor_stop": _control(planted, root / "stop")}


def text_runs(root: Path) -> dict[str, Any]:
    from feedbackrl.config import build_config
    from feedbackrl.envs.procedural.reverse import ReverseTask
    from feedbackrl.log import MemorySink
    from feedbackrl.models.load import load_policy, load_tokenizer
    from feedbackrl.models.tiny import make_tiny
    from feedbackrl.rewards.verdict import Verdict
    from feedbackrl.train.grpo import train_grpo
    from feedbackrl.train.ppo import train_ppo

    @dataclass
    class LetterReverse(ReverseTask):  # partial credit, so a random policy's rewards differ and it moves
        def verify(self, problem: Any, completion: str) -> Verdict:
            score = sum(c.islower() for c in completion[:4]) / 4
            return Verdict(score, score == 1.0, f"{score:.2f} letters")

    tiny = make_tiny(root / "tiny", size="tiny", seed=0)
    out: dict[str, Any] = {}
    # zero_variance with window 1 and max_frac 0 fires at every step: its action runs at a known step
    for algo, action, steps in (("grpo", "rollback", 4), ("ppo", "log", 3), ("grpo", "stop", 3)):
        cfg = build_config({
            "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4},
            "algo": {"name": algo, "steps": steps, "lr": 1e-2, **({"minibatches": 1} if algo == "ppo" else {})},
            "train": {"threads": 1, "checkpoint_every": 2},
            "monitors": {"detectors": ["zero_variance"], "options": {"zero_variance": {"window": 1, "max_frac": 0.0}},
                         "actions": {"zero_variance": action}, "max_rollbacks": 2}})
        model, tok = load_policy(str(tiny)), load_tokenizer(str(tiny))
        sink, run_dir = MemorySink(), root / f"{algo}_{action}"
        (train_ppo if algo == "ppo" else train_grpo)(cfg, model, tok, LetterReverse(), run_dir, sink)
        out[f"text_{algo}_{action}"] = {"rows": _clean(sink.rows), "policy": _digest(model.state_dict()),
                                        "checkpoints": sorted(p.name for p in (run_dir / "checkpoints").iterdir())}
    return out


def source() -> str:
    """The commit of the checkout whose feedbackrl these runs imported (it may be another tree's than this
    script's); 'unknown' outside a checkout."""
    import feedbackrl

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(feedbackrl.__file__).parent,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    runs = {}
    for name in sorted(set(a) | set(b)):
        ra, rb = a.get(name), b.get(name)
        differ = sorted(k for k in set(ra or {}) | set(rb or {}) if (ra or {}).get(k) != (rb or {}).get(k))
        values = sum(len(r[1] if isinstance(r, list) and len(r) == 2 and isinstance(r[1], dict) else r)
                     for r in (ra or {}).get("rows", []))
        runs[name] = {"equal": not differ, "differ": differ, "rows": len((ra or {}).get("rows", [])),
                      "values": values}
    return {"all_equal": all(r["equal"] for r in runs.values()), "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="where to write the runs' records (or the comparison)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="two records to compare")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.compare:
        result = {**compare(*(json.loads(p.read_text())["runs"] for p in args.compare)),
                  "records": [{"file": p.name, **{k: json.loads(p.read_text())[k]
                                                  for k in ("source_commit", "provenance")}} for p in args.compare],
                  "provenance": provenance()}
        print(json.dumps({k: result[k] for k in ("all_equal", "runs")}, indent=1))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = {"runs": {**control_runs(Path(tmp)), **text_runs(Path(tmp))}, "source_commit": source(),
                      "provenance": provenance()}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
