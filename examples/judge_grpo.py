"""GRPO rewarded by a judge over HTTP, with the judge's agreement with gold logged every step.

The task is word reversal from the demo's sloppy SFT warm start. The reward is a hybrid: a rule
check for the hard constraint (the answer uses exactly the word's letters) gates a pointwise
judge for the criterion the rule cannot see (the letters are in reversed order). The judge is
a scripted, rule-backed judge served over loopback by an OpenAI-compatible FastAPI app, imperfect
on purpose (`--noise`: the chance it answers at random); the tiny model is too weak to judge.
Swap `--base-url` for a real endpoint (vLLM, llama.cpp, a hosted API) to use a model instead.

    python examples/judge_grpo.py --out runs/judge_grpo --steps 40

Writes OUT/metrics.jsonl (with judge/* metrics, judge/gold_agreement over all completions and
judge/gold_agreement_judged over those that passed the rule check and reached the judge) and
OUT/judge_run.json (held-out greedy accuracy before and after, mean agreement, calls, tokens).
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import torch

from feedbackrl.config import build_config
from feedbackrl.envs.procedural.reverse import ReverseTask
from feedbackrl.episodes.kinds import evaluate
from feedbackrl.feedback.judge_server import RuleJudge, chat_app
from feedbackrl.feedback.server import LiveServer
from feedbackrl.log import JsonlSink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.tiny import make_tiny
from feedbackrl.rewards.judge import Criterion, Hybrid, PointwiseJudge, Rubric
from feedbackrl.rewards.judge_backends import CachedChat, OpenAIChat
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.sft import sft_warmstart

TASK = {"min_len": 3, "max_len": 7, "alphabet_size": 10, "demo_noise": 0.6, "sloppy_from": 5}
RUBRIC = Rubric((Criterion("order", 1.0, "the letters are the task's word written backwards, in that order"),),
                task="Judge the answer to a word-reversal task (the word is before the '=').")


def same_letters(problem: Problem, completion: str) -> Verdict:
    ok = sorted(completion.strip()) == sorted(problem.answer)
    return Verdict(float(ok), ok, "the word's letters" if ok else "other letters")


def sft_base(out: Path) -> Path:
    if (out / "config.json").is_file():
        return out
    cfg = build_config({"sft": {"steps": 500, "batch_size": 64, "lr": 3e-3}})
    init = make_tiny(out.parent / "init", "tiny", 0)
    model, tok = load_policy(str(init)), load_tokenizer(str(init))
    sink = JsonlSink(out.parent / "sft.jsonl")
    sft_warmstart(model, tok, ReverseTask(**TASK), cfg.sft, 0, sink)
    sink.close()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/judge_grpo"))
    ap.add_argument("--base", type=Path, default=Path("runs/planted_base/base"), help="SFT start (built if missing)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--base-url", default="scripted")
    ap.add_argument("--model", default="judge")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    task = ReverseTask(**TASK)
    rule = RuleJudge(lambda t, r: float(r == t.removesuffix("=")[::-1]), ("order",), noise=args.noise)
    server = LiveServer(chat_app(rule)) if args.base_url == "scripted" else nullcontext(None)
    with server as live:
        chat = CachedChat(OpenAIChat(args.model, base_url=live.url + "/v1" if live else args.base_url))
        reward = Hybrid({"letters": same_letters}, PointwiseJudge(chat, RUBRIC))

        def scorer(problems, texts):
            with ThreadPoolExecutor(8) as pool:
                verdicts = list(pool.map(reward, problems, texts))
            gold = [task.verify(p, t).passed for p, t in zip(problems, texts, strict=True)]
            agree = [v.passed == g for v, g in zip(verdicts, gold, strict=True)]
            judged = [a for a, v in zip(agree, verdicts, strict=True) if "judge" in v.details["parts"]]
            return verdicts, {**chat.pop_metrics(), "judge/gold_agreement": sum(agree) / len(agree),
                              "judge/gold_agreement_judged": sum(judged) / max(len(judged), 1),
                              "judge/judged": len(judged), "reward/gold_mean": sum(gold) / len(gold)}

        cfg = build_config({"rollout": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 8},
                            "algo": {"steps": args.steps, "lr": 5e-4}, "train": {"threads": 1}})
        base = sft_base(args.base)
        model, tok = load_policy(str(base)), load_tokenizer(str(base))
        heldout = task.heldout(200)
        before = evaluate(model, tok, task, heldout, 8, k=4, temperature=1.0, batch_size=200).accuracy
        sink, t0 = JsonlSink(args.out / "metrics.jsonl"), time.perf_counter()
        train_grpo(cfg, model, tok, task, args.out, sink, scorer=scorer)
        sink.close()
        after = evaluate(model, tok, task, heldout, 8, k=4, temperature=1.0, batch_size=200).accuracy
    rows = [json.loads(line) for line in (args.out / "metrics.jsonl").read_text().splitlines()]
    result = {"greedy_accuracy_before": before, "greedy_accuracy_after": after, "steps": args.steps,
              "judge_noise": args.noise, "rl_seconds": time.perf_counter() - t0,
              "judge_gold_agreement_mean": sum(r["judge/gold_agreement"] for r in rows) / len(rows),
              "judge_gold_agreement_judged": sum(r["judge/gold_agreement_judged"] * r["judge/judged"] for r in rows)
              / max(sum(r["judge/judged"] for r in rows), 1),
              "judge_calls": sum(r["judge/calls"] for r in rows), "judge_cache_hits": sum(r["judge/cache_hits"]
                                                                                     for r in rows),
              "judge_tokens": sum(r["judge/prompt_tokens"] + r["judge/completion_tokens"] for r in rows)}
    (args.out / "judge_run.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
