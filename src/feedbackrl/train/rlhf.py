"""The preference half of a run, start to finish: build or load the policy, optional SFT warm
start, then one of

- `reward_model`: sample response pairs from the policy, label them with the simulated labeller
  (or read `prefs.path`, or a labelling project's pairs with `prefs.db` + `prefs.project`), train
  a reward (or cost) model, report its held-out pairwise accuracy next to the ceiling the
  labeller's noise allows;
- `dpo` (DPO / IPO / PRO): the same data, direct preference optimisation of the policy;
- `ppo`, `rloo`, `grpo` with `reward.model` set: online RL against the learned reward model
  (the verifier when `reward.model` is empty, for ppo); the gold reward of every training batch
  is logged next to the proxy, which is how over-optimisation shows.

Every run ends by judging the trained policy against the policy it started from (the SFT model)
with the hidden gold score: sampled and greedy win rates, gold means and exact-answer accuracy on
the task's held-out prompts. Training never sees the gold score.

`OUT/` after a run: `config.json`, `metrics.jsonl`, `report.json`, `curves.png`, `sft_policy/`
(the starting policy, reusable as `model.path` by later runs), and depending on the algorithm
`prefs/{train,heldout}.jsonl`, `reward_model/`, `policy/` (dpo) or `checkpoints/step_N/`.
"""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import ConfigError, RunConfig
from feedbackrl.data.labeller import (
    GoldScore,
    Labeller,
    gold_cost_for,
    gold_score_for,
    label_ceiling,
    label_rows,
    sample_candidates,
    write_jsonl,
)
from feedbackrl.data.preferences import load_preference_pairs, load_rankings
from feedbackrl.envs.base import Task
from feedbackrl.envs.registry import make_task
from feedbackrl.log import MetricsSink, console, read_jsonl
from feedbackrl.models.reward import build_reward_model, save_reward_model
from feedbackrl.rewards.learned import LearnedReward
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.rollout.generate import generate
from feedbackrl.train.collect import Scorer
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.ppo import train_ppo
from feedbackrl.train.preference import train_dpo, train_reward_model
from feedbackrl.train.sft import sft_warmstart

WIN_RATE_SAMPLES = 4  # sampled completions per held-out prompt and model in the gold comparison


# --- preference data -------------------------------------------------------------------------------


def preference_data(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                    labeller: Labeller, out_dir: Path, heldout: bool) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """(train items, held-out items, info): pairs or rankings, labelled here or read from `prefs.path`.

    Generated data is written to OUT/prefs/ and read back with the ordinary loaders, so a run sees
    exactly what a user loading those files would. Held-out items are only made when asked for
    (the reward model's evaluation): generated from the task's held-out prompts, or, for a file
    given in `prefs.path`, its last `prefs.heldout_prompts` rows (at most a fifth of it).
    """
    p, k = cfg.prefs, cfg.prefs.responses
    load = load_rankings if k > 2 else load_preference_pairs
    held: list[Any] = []
    if p.path or p.db:
        source, shown = (p.path, p.path) if p.path else _database_pairs(p.db, p.project)
        train, dropped = load(source, on_bad_row="drop")
        if heldout:
            n_held = min(p.heldout_prompts, len(train) // 5)
            train, held = train[: len(train) - n_held], train[len(train) - n_held :]
        info: dict[str, Any] = {"source": shown, "dropped_rows": [str(x) for x in dropped[:5]]}
    else:
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(cfg.train.seed + 1)
        prompt_rng = random.Random(cfg.train.seed + 2)
        splits = {"train": [task.sample(prompt_rng) for _ in range(p.prompts)]}
        if heldout:
            splits["heldout"] = task.heldout(p.heldout_prompts)
        info = {"source": "simulated labeller", "labeller_temperature": p.temperature}
        for name, problems in splits.items():
            cands = sample_candidates(model, tokenizer, problems, k, cfg.rollout.max_new_tokens,
                                      cfg.rollout.temperature, gen)
            rows = label_rows(labeller, problems, cands, k)
            write_jsonl(rows, out_dir / "prefs" / f"{name}.jsonl")
            info[f"{name}_skipped_prompts"] = len(problems) - len(rows)
        train, _ = load(out_dir / "prefs" / "train.jsonl")
        if heldout:
            held, _ = load(out_dir / "prefs" / "heldout.jsonl")
        info["seconds"] = time.perf_counter() - t0
    if not train or (heldout and not held):
        raise ConfigError(f"preference data: {len(train)} training and {len(held)} held-out items; need both "
                         "(raise prefs.prompts, or sample at a higher rollout.temperature)")
    info.update(train_items=len(train), heldout_items=len(held))
    if held and k == 2:
        info["heldout_ceiling"] = label_ceiling([x.meta for x in held])
    return train, held, info


def _database_pairs(db: str, project: str) -> tuple[list[dict[str, Any]], str]:
    """`prefs.db`: (the project's pairs from the labelling database, a printable source name).

    Needs the feedback extra; imported here because core code never imports `feedback`."""
    try:
        from feedbackrl.feedback.export import display_url, read_pairs
        from feedbackrl.feedback.store import FeedbackError
    except ImportError as e:
        raise ConfigError(f"prefs.db needs the feedback extra ({e.name} is missing): pip install -e '.[feedback]'"
                          ) from None
    try:
        return read_pairs(db, project), f"project {project!r} in {display_url(db)}"
    except FeedbackError as e:
        raise ConfigError(str(e)) from None


# --- scoring and the gold comparison ---------------------------------------------------------------


def make_scorer(cfg: RunConfig, task: Task, gold: GoldScore) -> Scorer:
    """The training reward (learned model, or the task's verifier) plus the gold score as metrics."""
    learned = LearnedReward.from_dir(cfg.reward.model) if cfg.reward.model else None

    def score(problems: list[Problem], texts: list[str]) -> tuple[list[Verdict], dict[str, float]]:
        verdicts = learned.batch(problems, texts) if learned is not None else task.verify_batch(problems, texts)
        golds = [gold(p, t) for p, t in zip(problems, texts, strict=True)]
        extra = {"reward/gold_mean": sum(golds) / len(golds), "reward/gold_pass_rate": golds.count(1.0) / len(golds)}
        if learned is not None:
            extra["reward/raw_mean"] = sum(v.details["raw"] for v in verdicts) / len(verdicts)
        return verdicts, extra

    return score


def _win_rate(a: list[float], b: list[float]) -> float:
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x, y in zip(a, b, strict=True)) / len(a)


def gold_comparison(policy: PreTrainedModel, baseline: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                    problems: list[Problem], gold: GoldScore, max_new_tokens: int, temperature: float,
                    samples: int = WIN_RATE_SAMPLES, seed: int = 1234) -> dict[str, float]:
    """Policy vs baseline on `problems`, judged by the gold score; a tie counts one half.

    `win_rate`: the i-th sample of the policy against the i-th sample of the baseline, for each
    prompt and i < samples (sampled at `temperature`); `win_rate_greedy`: greedy against greedy.
    """
    prompts = [p.prompt for p in problems]
    owners = [p for p in problems for _ in range(samples)]
    out: dict[str, float] = {}
    scores: dict[str, dict[str, list[float]]] = {}
    for name, model in (("policy", policy), ("baseline", baseline)):
        greedy = generate(model, tokenizer, prompts, max_new_tokens, greedy=True).texts
        sampled = generate(model, tokenizer, [p for p in prompts for _ in range(samples)], max_new_tokens,
                           temperature, generator=torch.Generator().manual_seed(seed)).texts
        scores[name] = {"greedy": [gold(p, t) for p, t in zip(problems, greedy, strict=True)],
                        "sampled": [gold(p, t) for p, t in zip(owners, sampled, strict=True)]}
        prefix = "" if name == "policy" else "baseline_"
        out[f"{prefix}gold_mean"] = sum(scores[name]["sampled"]) / len(owners)
        out[f"{prefix}accuracy"] = scores[name]["greedy"].count(1.0) / len(problems)
    out["win_rate"] = _win_rate(scores["policy"]["sampled"], scores["baseline"]["sampled"])
    out["win_rate_greedy"] = _win_rate(scores["policy"]["greedy"], scores["baseline"]["greedy"])
    out["prompts"] = float(len(problems))
    return out


# --- the run ---------------------------------------------------------------------------------------


def run_rlhf(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path,
             sink: MetricsSink) -> dict[str, Any]:
    """Run a preference recipe from `model` into `out_dir` (see the module docstring). Returns the report."""
    t_start = time.perf_counter()
    name = cfg.algo.name
    task = make_task(cfg.task)
    gold = gold_score_for(task)
    labeller = Labeller(gold, cfg.prefs.temperature, seed=cfg.train.seed + 3)
    if name == "reward_model" and cfg.algo.kind == "cost" and not (cfg.prefs.path or cfg.prefs.db):
        try:  # the safety labeller: a hidden gold cost, and safe/unsafe labels
            labeller = Labeller(gold_cost_for(task), cfg.prefs.temperature, seed=cfg.train.seed + 3, kind="cost")
        except ValueError as e:
            raise ConfigError(f"algo.kind = 'cost': {e}") from None
    if cfg.sft.steps:
        sft_warmstart(model, tokenizer, task, cfg.sft, cfg.train.seed, sink)
    model.save_pretrained(out_dir / "sft_policy")
    tokenizer.save_pretrained(out_dir / "sft_policy")
    report: dict[str, Any] = {"task": cfg.task.name, "algo": name}
    if name == "reward_model":
        report["kind"] = cfg.algo.kind
    if name in ("grpo", "rloo", "ppo"):
        report["reward"] = cfg.reward.model or "verifier"
    t_train = time.perf_counter()
    if name in ("reward_model", "dpo"):
        train_items, held_items, report["prefs"] = preference_data(cfg, model, tokenizer, task, labeller, out_dir,
                                                                   heldout=name == "reward_model")
    baseline = copy.deepcopy(model).eval()
    if name == "reward_model":
        rm = build_reward_model(model, cfg.algo.kind, cfg.algo.head)
        report["reward_model"] = train_reward_model(cfg.algo, rm, tokenizer, train_items, held_items, cfg.train.seed,
                                                    sink)
        report["reward_model"]["dir"] = str(save_reward_model(rm, tokenizer, out_dir / "reward_model"))
    elif name == "dpo":
        report["final"] = train_dpo(cfg.algo, model, tokenizer, train_items, cfg.train.seed, sink)
        model.save_pretrained(out_dir / "policy")
        tokenizer.save_pretrained(out_dir / "policy")
    elif name == "ppo":
        report["final"] = train_ppo(cfg, model, tokenizer, task, out_dir, sink, make_scorer(cfg, task, gold))
    else:
        report["final"] = train_grpo(cfg, model, tokenizer, task, out_dir, sink, scorer=make_scorer(cfg, task, gold))
    report["train_seconds"] = time.perf_counter() - t_train
    if name != "reward_model":
        report["gold_vs_sft"] = gold_comparison(model, baseline, tokenizer, task.heldout(cfg.task.heldout_size), gold,
                                                cfg.rollout.max_new_tokens, cfg.rollout.temperature)
    report["wall_seconds"] = time.perf_counter() - t_start
    return report


def print_rlhf_report(report: dict[str, Any]) -> None:
    if "reward_model" in report:
        rm, ceiling = report["reward_model"], report["prefs"].get("heldout_ceiling", {})
        console.print(f"{report['kind']} model: held-out pairwise accuracy {rm['rm/heldout_accuracy']:.3f}"
                      f" (ceiling from labeller noise: expected {ceiling.get('expected', float('nan')):.3f},"
                      f" realised {ceiling.get('realised', float('nan')):.3f});"
                      f" agreement with gold {rm.get('rm/heldout_gold_agreement', float('nan')):.3f}")
        if "rm/heldout_safety_accuracy" in rm:
            console.print(f"safe/unsafe accuracy on held-out responses {rm['rm/heldout_safety_accuracy']:.3f}")
    if "gold_vs_sft" in report:
        g = report["gold_vs_sft"]
        console.print(f"gold win rate vs SFT: sampled {g['win_rate']:.3f}, greedy {g['win_rate_greedy']:.3f};"
                      f" gold mean {g['baseline_gold_mean']:.3f} -> {g['gold_mean']:.3f};"
                      f" greedy accuracy {g['baseline_accuracy']:.3f} -> {g['accuracy']:.3f}")
    console.print(f"wall time {report['wall_seconds']:.1f}s (training {report['train_seconds']:.1f}s)")


def _smooth(xs: list[float], window: int) -> list[float]:
    """Trailing moving average (shorter at the start)."""
    return [sum(xs[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(xs))]


def plot_proxy_vs_gold(runs: dict[str, Path], png_path: Path, title: str = "", window: int = 10) -> None:
    """Proxy (training) reward and hidden gold reward per RL step for one or more runs' metrics.jsonl.

    Raw values are drawn faint, a `window`-step moving average bold; proxy solid, gold dashed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (label, path) in enumerate(runs.items()):
        rl = [r for r in read_jsonl(path) if r.get("phase") == "rl"]
        steps, color = [r["step"] for r in rl], f"C{i}"
        for key, style, name in (("reward/mean", "-", "proxy"), ("reward/gold_mean", "--", "gold")):
            if rl and key in rl[0]:
                ys = [r[key] for r in rl]
                ax.plot(steps, ys, style, color=color, alpha=0.2, linewidth=0.8)
                ax.plot(steps, _smooth(ys, window), style, color=color, linewidth=2, label=f"{label}: {name}")
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"mean reward of the training batch ({window}-step average)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def write_rlhf_plot(metrics_path: Path, png_path: Path, title: str = "") -> None:
    """Online runs: proxy and gold reward per step. Offline runs: the loss per step (and RM accuracy)."""
    rows = read_jsonl(metrics_path)
    if any(r.get("phase") == "rl" for r in rows):
        plot_proxy_vs_gold({"this run": metrics_path}, png_path, title)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key in ("loss/rm", "loss/pref"):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        if pts:
            ax.plot(*zip(*pts, strict=True), label=key)
    held = [(r["step"], r["rm/heldout_accuracy"]) for r in rows if "rm/heldout_accuracy" in r]
    if held:
        ax.plot(*zip(*held, strict=True), "o-", label="held-out pairwise accuracy")
    ax.set_xlabel("optimizer step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def finish_rlhf(report: dict[str, Any], out_dir: Path) -> None:
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    write_rlhf_plot(out_dir / "metrics.jsonl", out_dir / "curves.png", f"{report['task']} / {report['algo']}")
    print_rlhf_report(report)

