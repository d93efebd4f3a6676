"""GRPO on a real pretrained model through the Python API: load, chat-render the task, evaluate,
train, evaluate again, write `report.json` and `curves.png` into the out dir.

    python examples/real_model_grpo.py recipes/smollm2_grpo.toml --out runs/smollm2 [--set algo.steps=10]
    python examples/real_model_grpo.py recipes/smollm2_grpo.toml --out runs/smollm2_base --eval-only

`make smollm2` runs the first line. The calls here (`load_policy`, `setup_policy`, `chat_task`,
`evaluate` with the truncation options) are the pieces a run path needs for a real model.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from feedbackrl.config import RunConfig, load_config
from feedbackrl.envs.base import Task
from feedbackrl.envs.chat import chat_task
from feedbackrl.envs.registry import make_task
from feedbackrl.episodes.kinds import evaluate
from feedbackrl.log import JsonlSink, console
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.policy import setup_policy
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.report import print_report, write_plot
from feedbackrl.train.run import start_run


def run_eval(model: Any, tokenizer: Any, task: Task, cfg: RunConfig) -> dict[str, Any]:
    problems = task.heldout(cfg.task.heldout_size)
    return evaluate(model, tokenizer, task, problems, cfg.rollout.max_new_tokens, k=cfg.eval.pass_k,
                    temperature=cfg.rollout.temperature, batch_size=cfg.eval.batch_size,
                    truncated_fails=cfg.rollout.truncated_fails, warn_truncated=cfg.eval.warn_truncated).to_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="dotted override, e.g. algo.lr=1e-6")
    ap.add_argument("--eval-only", action="store_true", help="evaluate the model as loaded, no training")
    args = ap.parse_args()
    cfg = load_config(args.recipe, args.overrides)
    t0 = time.perf_counter()
    out = start_run(cfg, args.out)
    model, tokenizer = load_policy(cfg.model.path), load_tokenizer(cfg.model.path)
    model = setup_policy(model, cfg.lora, cfg.train)  # [lora], gradient checkpointing, precision check
    task = chat_task(make_task(cfg.task), tokenizer, cfg.model.chat_template, cfg.model.system_prompt)
    before = run_eval(model, tokenizer, task, cfg)
    (out / "eval_before.json").write_text(json.dumps(before, indent=2))
    console.print(f"before: accuracy {before['accuracy']:.3f}  truncated {before['truncated_frac']:.3f}  "
                  f"({time.perf_counter() - t0:.0f}s)")
    if args.eval_only:
        return
    sink = JsonlSink(out / "metrics.jsonl")
    sink.log(0, {"phase": "eval", "eval/accuracy": before["accuracy"]})

    def on_eval(step: int) -> dict[str, Any]:
        return {"eval/accuracy": run_eval(model, tokenizer, task, cfg)["accuracy"]}

    t_rl = time.perf_counter()
    try:
        train_grpo(cfg, model, tokenizer, task, out, sink, on_eval=on_eval)
        rl_seconds = time.perf_counter() - t_rl
        after = run_eval(model, tokenizer, task, cfg)
        sink.log(cfg.algo.steps, {"phase": "eval", "eval/accuracy": after["accuracy"]})
    finally:
        sink.close()
    report = {"task": cfg.task.name, "algo": cfg.algo.name, "steps": cfg.algo.steps, "eval_before": before,
              "eval_after": after, "rl_seconds": rl_seconds, "wall_seconds": time.perf_counter() - t0}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    write_plot(out / "metrics.jsonl", out / "curves.png")
    print_report(report)


if __name__ == "__main__":
    main()
