"""The base model's held-out greedy accuracy on candidate word-problem generators, to choose a training task.

    python benchmarks/smollm2_before_accuracy.py --n 48 gsm_symbolic aiw leg_counting_3 word_problems

A generator has room to learn when the base model gets 10-40% of its *finished* answers right and finishes
most of them within the token budget: well below, GRPO's groups are all wrong and carry no signal; well above,
there is little to gain. Every candidate runs with `recipes/smollm2_word_grpo.toml`'s model, system prompt,
160 new tokens and greedy decoding; only the task differs. Writes benchmarks/results/smollm2_before_accuracy.json
(accuracy, accuracy among finished answers, truncated fraction, mean answer length, two sample answers each).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import provenance

RESULTS = Path(__file__).parent / "results"
RECIPE = "recipes/smollm2_word_grpo.toml"
CANDIDATES: dict[str, list[str]] = {
    "gsm_symbolic": ["task.name=reasoning_gym", "task.options={dataset='gsm_symbolic',verifier='math',size=2000}"],
    "aiw": ["task.name=reasoning_gym", "task.options={dataset='aiw',verifier='math',size=5000}"],
    "leg_counting_3": ["task.name=reasoning_gym", "task.options={dataset='leg_counting',verifier='math',"
                       "config={min_animals=2,max_animals=3,max_instances=5}}"],
    "leg_counting_12": ["task.name=reasoning_gym", "task.options={dataset='leg_counting',verifier='math',"
                        "config={min_animals=1,max_animals=2,max_instances=4}}"],
    "basic_arithmetic_3": ["task.name=reasoning_gym", "task.options={dataset='basic_arithmetic',verifier='math',"
                           "config={min_terms=3,max_terms=3,max_digits=2,operators=['+','-'],"
                           "allow_parentheses=false,allow_negation=false,format_style='natural'}}"],
    "word_problems": ["task.name=word_problems", "task.options={steps=[1,2,3],max_number=20}"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("candidates", nargs="+", choices=sorted(CANDIDATES))
    ap.add_argument("--n", type=int, default=48, help="held-out problems per candidate")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--out", type=Path, default=RESULTS / "smollm2_before_accuracy.json")
    args = ap.parse_args()

    from feedbackrl.config import load_config
    from feedbackrl.envs.registry import make_task
    from feedbackrl.models.load import load_policy, load_tokenizer
    from feedbackrl.train.run import model_task, run_eval, set_threads

    set_threads(1)
    model, tok = load_policy(args.model), load_tokenizer(args.model)
    rows = {}
    for name in args.candidates:
        t0, c0 = time.perf_counter(), time.process_time()
        cfg = load_config(RECIPE, [*CANDIDATES[name], f"task.heldout_size={args.n}", f"eval.batch_size={args.n}"])
        r = run_eval(model, tok, model_task(cfg, make_task(cfg.task), tok), cfg).to_dict()
        rows[name] = {"overrides": CANDIDATES[name], **{k: r[k] for k in (
            "n", "accuracy", "finished_accuracy", "truncated_frac", "mean_len")},
            "wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
            "samples": [s["completion"] for s in r["samples"][:2]]}
        print(name, {k: v for k, v in rows[name].items() if k not in ("samples", "overrides")}, flush=True)
    args.out.write_text(json.dumps({"provenance": provenance(), "recipe": RECIPE, "candidates": rows}, indent=2))


if __name__ == "__main__":
    main()
