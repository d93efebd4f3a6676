"""Preference data for a run, and the hidden gold score a run is judged by.

- `preference_data`: pairs or rankings sampled from the policy and labelled by the simulated
  labeller (hidden gold score, Bradley-Terry noise; `data/labeller.py`), or read from `prefs.path`,
  or a labelling project's pairs (`prefs.db` + `prefs.project`).
- `gold_scorer`: the recipe's training reward plus the gold score of the same completions as
  metrics (`reward/gold_mean`, and `gold_agreement`: how often the reward agrees with gold), which is
  how over-optimisation of a proxy shows.
- `gold_comparison`: the trained policy against the policy it started from, judged by the gold
  score. Training never sees the gold score.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import ConfigError, RunConfig
from feedbackrl.data.labeller import (
    GoldScore,
    SimulatedLabeller,
    label_ceiling,
    label_rows,
    sample_candidates,
)
from feedbackrl.data.preferences import load_preference_pairs, load_rankings
from feedbackrl.data.rows import write_jsonl
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Scorer
from feedbackrl.models.chat import use_chat
from feedbackrl.rewards.registry import BatchReward, build_reward, part_metrics
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.rollout.generate import generate

WIN_RATE_SAMPLES = 4  # sampled completions per held-out prompt and model in the gold comparison


def preference_data(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                    labeller: SimulatedLabeller, out_dir: Path,
                    heldout: bool) -> tuple[list[Any], list[Any], dict[str, Any]]:
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
        # chat-format rows are rendered with the model's own template (model.chat_template), not a stand-in
        chat = tokenizer if use_chat(tokenizer, cfg.model.chat_template) else None
        train, dropped = load(source, on_bad_row="drop", tokenizer=chat)
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


def training_reward(cfg: RunConfig, task: Task) -> BatchReward:
    """The recipe's `[reward]` as a batch scorer (`rewards/registry.py`); the task's verifier by default."""
    return build_reward(cfg.reward, task.verify_batch)


def training_cost(cfg: RunConfig, task: Task) -> BatchReward | None:
    """The recipe's `[cost]` built by the same registry as `[reward]` (a source's score is the cost); None
    without one. `cost.model` must hold a cost model (a reward model's score is no cost)."""
    if cfg.cost is None:
        return None
    cost = build_reward(cfg.cost, task.verify_batch, "cost")
    kind = getattr(getattr(getattr(cost, "__self__", None), "model", None), "kind", "cost")
    if cfg.cost.model and kind != "cost":
        raise ConfigError(f"cost.model = {cfg.cost.model!r} holds a {kind} model; [cost] needs a cost model (a "
                          "reward_model run with algo.kind = 'cost'); a reward model goes in [reward]")
    return cost


def gold_scorer(reward: BatchReward, gold: GoldScore | None, cost: BatchReward | None = None) -> Scorer:
    """`reward` as a `Scorer` (a composite's parts logged as `reward/<part>/...`); with `gold`, the gold
    score of the same completions is logged beside it; with `cost` (the recipe's `[cost]`, built by the same
    registry), each completion's cost too (`cost/mean`, `cost/<part>/mean`). Gold and cost travel with each
    verdict as named signals (`details["signals"]`, read by `episodes/single_turn.py:score_rollout` into
    `Batch.signals`), the cost's own verdict as evidence under `details["cost"]`."""

    pop_metrics = getattr(reward, "pop_metrics", None)  # a judge's per-step counters (rewards/judge.py: BatchJudge)

    def score(problems: Sequence[Problem], texts: Sequence[str]) -> tuple[list[Verdict], dict[str, float]]:
        verdicts = reward(problems, texts)
        extra = part_metrics(verdicts)
        if pop_metrics is not None:
            extra.update(pop_metrics())
        signals: dict[str, list[float]] = {}
        if gold is not None:
            golds = [gold(p, t) for p, t in zip(problems, texts, strict=True)]
            signals["gold"] = golds
            extra.update({"reward/gold_mean": sum(golds) / len(golds),
                          "reward/gold_pass_rate": golds.count(1.0) / len(golds),
                          **gold_agreement(problems, verdicts, golds)})
            raw = [v.details["raw"] for v in verdicts if "raw" in v.details]
            if len(raw) == len(verdicts):  # a learned reward model's uncalibrated score
                extra["reward/raw_mean"] = sum(raw) / len(raw)
        costs: list[Verdict] = []
        if cost is not None:
            costs = cost(problems, texts)
            if len(costs) != len(verdicts):
                raise ValueError(f"the cost returned {len(costs)} verdicts for {len(verdicts)} completions")
            signals["cost"] = [float(c.score) for c in costs]
            extra.update({"cost/mean": sum(signals["cost"]) / len(costs),
                          "cost/nonzero_frac": sum(c > 0 for c in signals["cost"]) / len(costs),
                          **part_metrics(costs, "cost")})
        if signals:
            verdicts = [replace(v, details={**v.details, "signals": {k: vs[i] for k, vs in signals.items()},
                                            **({"cost": costs[i].to_dict()} if costs else {})})
                        for i, v in enumerate(verdicts)]
        return verdicts, extra

    return score


def gold_agreement(problems: Sequence[Problem], verdicts: Sequence[Verdict],
                   golds: Sequence[float]) -> dict[str, float]:
    """How far the training reward agrees with gold on one step's completions.

    `reward/gold_agreement`: the share of completions whose verdict passes exactly when gold passes (gold 1.0).
    `reward/gold_rank_agreement`: over pairs of completions of the same prompt with different gold, the share the
    reward orders as gold does (equal reward counts one half) -- what a group-relative advantage reads;
    `reward/gold_rank_pairs`: how many such pairs (0: the metric is left out).
    """
    out = {"reward/gold_agreement": sum(v.passed == (g == 1.0) for v, g in zip(verdicts, golds, strict=True))
           / len(golds)}
    by_prompt: dict[str, list[tuple[float, float]]] = {}
    for p, v, g in zip(problems, verdicts, golds, strict=True):
        by_prompt.setdefault(p.prompt, []).append((float(v.score), g))
    agree, pairs = 0.0, 0
    for rows in by_prompt.values():
        for i, (ri, gi) in enumerate(rows):
            for rj, gj in rows[i + 1 :]:
                if gi != gj:
                    pairs += 1
                    agree += 0.5 if ri == rj else float((ri > rj) == (gi > gj))
    out["reward/gold_rank_pairs"] = float(pairs)
    if pairs:
        out["reward/gold_rank_agreement"] = agree / pairs
    return out


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


