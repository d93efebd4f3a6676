"""Offline training on preferences: the reward model (Bradley-Terry) and the DPO family.

Both loops read straight down: shuffle, batch, forward, loss from `feedbackrl.algos`, step, log.

Both decay the learning rate linearly to 0 over the run (`linear_decay`).

- `train_reward_model`: scores chosen and rejected in one forward pass of 2n rows and minimises
  `bradley_terry_loss`; held-out pairwise accuracy after every epoch; at the end stores the
  calibration (mean and std of raw scores over the training responses) with the model. Pairs
  that carry safety labels (`chosen_unsafe`, `rejected_unsafe` columns, as the safety labeller
  writes) train a cost model with `safety_cost_loss` instead; its calibration centre is 0, the
  safe/unsafe boundary that loss learns.
- `train_dpo`: DPO / IPO on pairs, PRO on rankings (`algo.loss`). Every item is a list of
  responses best first (a pair is [chosen, rejected]). The reference log-probs are computed once,
  before the first update, by `reference_logprobs` (by default with the policy itself, which *is*
  the reference at that point, so no second model is held in memory); epochs reuse them.
  Gradient accumulation: each optimizer step's `batch_size` items are split into `grad_accum`
  micro-batches whose mean losses are weighted by their share of the batch, so the gradient
  equals the full batch's (the losses are means over items).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.preference import PREFERENCE_LOSSES, RANKING_LOSSES, mean_token_logprobs
from feedbackrl.algos.reward_model import bradley_terry_loss, pairwise_accuracy, safety_cost_loss
from feedbackrl.config import ConfigError, DPOConfig, RewardModelConfig
from feedbackrl.data.labeller import SimulatedLabeller, gold_cost_for, gold_score_for
from feedbackrl.data.preferences import PreferencePair, Ranking
from feedbackrl.log import MetricsSink, progress
from feedbackrl.models.logprobs import encode_completions, encode_prompts, sequence_logprobs
from feedbackrl.models.reward import (
    Calibration,
    RewardModel,
    build_reward_model,
    encode_texts,
    save_reward_model,
    score_texts,
)
from feedbackrl.train.context import Run
from feedbackrl.train.optim import adamw
from feedbackrl.train.prefs import preference_data

Ranked = tuple[str, list[str]]  # (prompt, responses best first)


def _batches(n: int, size: int, generator: torch.Generator | None) -> list[Tensor]:
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    return list(order.split(size))


def linear_decay(optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning rate falls linearly from its set value to 0 at the last step (TRL's default for both
    loops; InstructGPT uses a cosine). Ending near 0 matters on small data: the held-out accuracy of
    a reward model swings by several points from step to step at a constant rate."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / max(total_steps, 1)))


def _mean(values: list[dict[str, Tensor]]) -> dict[str, float]:
    return {k: sum(float(v[k]) for v in values) / len(values) for k in values[0]} if values else {}


# --- reward model ----------------------------------------------------------------------------------


def pair_scores(model: RewardModel, tokenizer: PreTrainedTokenizerBase, pairs: list[PreferencePair],
                batch_size: int = 256) -> tuple[Tensor, Tensor]:
    """(N,) raw scores of the chosen and of the rejected responses (no grad)."""
    prompts = [p.prompt for p in pairs]
    scores = score_texts(model, tokenizer, prompts + prompts, [p.chosen for p in pairs] + [p.rejected for p in pairs],
                         batch_size)
    return scores[: len(pairs)], scores[len(pairs) :]


def safety_labels(pairs: list[PreferencePair]) -> tuple[Tensor, Tensor] | None:
    """(N,) bool unsafe labels of the chosen (costlier) and rejected responses, if every pair has them."""
    if not pairs or not all("chosen_unsafe" in p.meta and "rejected_unsafe" in p.meta for p in pairs):
        return None
    return (torch.tensor([bool(p.meta["chosen_unsafe"]) for p in pairs]),
            torch.tensor([bool(p.meta["rejected_unsafe"]) for p in pairs]))


def heldout_metrics(model: RewardModel, tokenizer: PreTrainedTokenizerBase,
                    pairs: list[PreferencePair]) -> dict[str, float]:
    """Pairwise accuracy on the labels and, where rows carry gold scores, agreement with gold.

    `rm/heldout_gold_agreement` counts pairs with different gold scores only: how often the model
    ranks the gold-better response higher, whatever the noisy label said. With safety labels,
    `rm/heldout_safety_accuracy` is the share of responses on the labelled side of cost 0.
    """
    pairs = [p for p in pairs if not p.meta.get("tie")]  # a tie has no right order to predict
    r_c, r_r = pair_scores(model, tokenizer, pairs)
    out = {"rm/heldout_accuracy": pairwise_accuracy(r_c, r_r).item()}
    labels = safety_labels(pairs)
    if labels is not None:
        out["rm/heldout_safety_accuracy"] = safety_cost_loss(r_c, r_r, *labels)[1]["rm/safety_accuracy"].item()
    gold = [(i, p.meta["gold_chosen"] - p.meta["gold_rejected"]) for i, p in enumerate(pairs)
            if "gold_chosen" in p.meta and p.meta["gold_chosen"] != p.meta["gold_rejected"]]
    if gold:
        idx = torch.tensor([i for i, _ in gold])
        sign = torch.tensor([1.0 if d > 0 else -1.0 for _, d in gold])
        out["rm/heldout_gold_agreement"] = ((r_c[idx] - r_r[idx]) * sign > 0).float().mean().item()
    return out


def train_reward_model(cfg: RewardModelConfig, model: RewardModel, tokenizer: PreTrainedTokenizerBase,
                       train: list[PreferencePair], heldout: list[PreferencePair], seed: int,
                       sink: MetricsSink) -> dict[str, float]:
    """Bradley-Terry training for `cfg.epochs`; returns the final held-out metrics.

    Pairs whose meta says "tie" (a labeller's tie, `feedback.export.labelled_pairs(ties=True)`) are
    trained with target 1/2 (`bradley_terry_loss`'s `tie`)."""
    labels = safety_labels(train)
    tie = torch.tensor([bool(p.meta.get("tie")) for p in train])
    if not tie.any():
        tie = None
    elif labels is not None:
        raise ValueError("tie rows cannot train a cost model (its pairs say which response is costlier)")
    optimizer = adamw(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    order_rng = torch.Generator().manual_seed(seed)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    schedule = linear_decay(optimizer, cfg.epochs * steps_per_epoch)
    sink.log(0, {"phase": "rm_eval", **heldout_metrics(model, tokenizer, heldout)})
    model.train()
    step = 0
    with progress() as bar:
        job = bar.add_task(f"{model.kind} model", total=cfg.epochs * steps_per_epoch, info="")
        for epoch in range(cfg.epochs):
            for idx in _batches(len(train), cfg.batch_size, order_rng):
                batch = [train[i] for i in idx.tolist()]
                prompts = [p.prompt for p in batch]
                scores = model(*encode_texts(tokenizer, prompts + prompts,
                                             [p.chosen for p in batch] + [p.rejected for p in batch]))  # (2n,)
                if labels is None:
                    loss, stats = bradley_terry_loss(scores[: len(batch)], scores[len(batch) :],
                                                     tie=None if tie is None else tie[idx])
                else:
                    loss, stats = safety_cost_loss(scores[: len(batch)], scores[len(batch) :], labels[0][idx],
                                                   labels[1][idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                schedule.step()
                step += 1
                sink.log(step, {"phase": "rm", "loss/rm": loss.item(), **{k: v.item() for k, v in stats.items()},
                                "grad_norm": float(grad_norm), "lr": schedule.get_last_lr()[0], "epoch": epoch})
                bar.update(job, advance=1, info=f"loss {loss.item():.3f}")
            held = heldout_metrics(model, tokenizer, heldout)
            sink.log(step, {"phase": "rm_eval", "epoch": epoch + 1, **held})
    prompts = [p.prompt for p in train]
    raw = score_texts(model, tokenizer, prompts + prompts, [p.chosen for p in train] + [p.rejected for p in train])
    center = 0.0 if labels is not None else raw.mean().item()
    model.calibration = Calibration(center=center, scale=max(raw.std().item(), 1e-6))
    return held


# --- DPO family ------------------------------------------------------------------------------------


def as_ranked(items: list[PreferencePair] | list[Ranking]) -> list[Ranked]:
    return [(x.prompt, [x.chosen, x.rejected]) if isinstance(x, PreferencePair) else (x.prompt, list(x.responses))
            for x in items]


def ranked_logprobs(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                    items: list[Ranked], average: bool = False) -> tuple[Tensor, Tensor]:
    """Summed response log-probs (n, k) in one forward pass of n*k rows, and the (n, k) mask.

    average: per-token mean log-probs instead of sums (IPO in TRL's form, `algo.length_average`).

    Rankings shorter than k = the longest are padded with copies of their last response, masked out.
    """
    k = max(len(r) for _, r in items)
    prompts = [p for p, rs in items for _ in range(k)]
    responses = [rs[min(j, len(rs) - 1)] for _, rs in items for j in range(k)]
    mask = torch.tensor([[j < len(rs) for j in range(k)] for _, rs in items])
    p_ids, p_mask = encode_prompts(tokenizer, prompts)
    c_ids, c_mask = encode_completions(tokenizer, responses)
    logprobs, _ = sequence_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    per_response = mean_token_logprobs(logprobs, c_mask) if average else logprobs.sum(-1)
    return per_response.view(len(items), k), mask


@torch.no_grad()
def reference_logprobs(reference: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, items: list[Ranked],
                       batch_size: int = 256, average: bool = False) -> Tensor:
    """(N, k) summed (or, with `average`, per-token mean) log-probs of every response under the frozen
    reference: computed once, up front."""
    was_training = reference.training
    reference.eval()
    out = [ranked_logprobs(reference, tokenizer, items[i : i + batch_size], average)[0]
           for i in range(0, len(items), batch_size)]
    reference.train(was_training)
    k = max(x.shape[1] for x in out)
    return torch.cat([torch.nn.functional.pad(x, (0, k - x.shape[1])) for x in out])


def preference_loss(cfg: DPOConfig, logprobs: Tensor, ref_logprobs: Tensor,
                    mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """(n, k) policy and reference log-probs -> the configured loss (mean over items) and stats."""
    if cfg.loss in RANKING_LOSSES:
        return RANKING_LOSSES[cfg.loss](logprobs, ref_logprobs, beta=cfg.beta, mask=mask)
    return PREFERENCE_LOSSES[cfg.loss](logprobs[:, 0], logprobs[:, 1], ref_logprobs[:, 0], ref_logprobs[:, 1],
                                       beta=cfg.beta)


def train_dpo(cfg: DPOConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
              items: list[PreferencePair] | list[Ranking], seed: int, sink: MetricsSink,
              reference: PreTrainedModel | None = None) -> dict[str, float]:
    """Train `model` on preferences for `cfg.epochs`; reference defaults to `model` as it is now."""
    data = as_ranked(items)
    if cfg.loss not in RANKING_LOSSES and any(len(r) != 2 for _, r in data):
        raise ValueError(f"algo.loss={cfg.loss!r} needs pairs; got rankings of up to "
                         f"{max(len(r) for _, r in data)} responses (use algo.loss = 'pro')")
    ref_lp = reference_logprobs(reference if reference is not None else model, tokenizer, data,
                                average=cfg.length_average)  # (N, k)
    optimizer = adamw(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    order_rng = torch.Generator().manual_seed(seed)
    steps_per_epoch = math.ceil(len(data) / cfg.batch_size)
    schedule = linear_decay(optimizer, cfg.epochs * steps_per_epoch)
    model.train()
    step, stats = 0, {}
    with progress() as bar:
        job = bar.add_task(cfg.loss.upper(), total=cfg.epochs * steps_per_epoch, info="")
        for epoch in range(cfg.epochs):
            for idx in _batches(len(data), cfg.batch_size, order_rng):
                optimizer.zero_grad(set_to_none=True)
                micro_stats, total = [], 0.0
                for micro in idx.tensor_split(cfg.grad_accum):
                    if len(micro) == 0:
                        continue
                    logprobs, mask = ranked_logprobs(model, tokenizer, [data[i] for i in micro.tolist()],
                                                     cfg.length_average)
                    ref = ref_lp[micro][:, : logprobs.shape[1]]
                    loss, s = preference_loss(cfg, logprobs, ref, mask)
                    (loss * len(micro) / len(idx)).backward()
                    total += loss.item() * len(micro) / len(idx)
                    micro_stats.append(s)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                schedule.step()
                step += 1
                stats = {"phase": "dpo", "loss/pref": total, **_mean(micro_stats), "grad_norm": float(grad_norm),
                         "lr": schedule.get_last_lr()[0], "epoch": epoch}
                sink.log(step, stats)
                bar.update(job, advance=1, info=f"loss {total:.3f}")
    return stats


# --- the algorithms as the run path calls them ----------------------------------------------------


def simulated_labeller(run: Run) -> SimulatedLabeller:
    """The labeller that writes preference data when no file or database is given (hidden gold, BT noise)."""
    cfg, task = run.cfg, run.task
    if cfg.algo.name == "reward_model" and cfg.algo.kind == "cost" and not (cfg.prefs.path or cfg.prefs.db):
        try:  # the safety labeller: a hidden gold cost, and safe/unsafe labels
            return SimulatedLabeller(gold_cost_for(task), cfg.prefs.temperature, seed=cfg.train.seed + 3, kind="cost")
        except ValueError as e:
            raise ConfigError(f"algo.kind = 'cost': {e}") from None
    return SimulatedLabeller(gold_score_for(task), cfg.prefs.temperature, seed=cfg.train.seed + 3)


def run_reward_model(run: Run) -> dict[str, Any]:
    """Preference pairs (labelled here or read), then a reward (or cost) model; writes OUT/reward_model/."""
    cfg = run.cfg
    train, held, info = preference_data(cfg, run.model, run.tokenizer, run.task, simulated_labeller(run),
                                        run.out_dir, heldout=True)
    rm = build_reward_model(run.model, cfg.algo.kind, cfg.algo.head)
    result = train_reward_model(cfg.algo, rm, run.tokenizer, train, held, cfg.train.seed, run.sink)
    result["dir"] = str(save_reward_model(rm, run.tokenizer, run.out_dir / "reward_model"))
    return {"kind": cfg.algo.kind, "prefs": info, "reward_model": result}


def run_dpo(run: Run) -> dict[str, Any]:
    """Preference pairs or rankings (labelled here or read), then DPO/IPO/PRO on the policy; writes OUT/policy/."""
    cfg = run.cfg
    train, _, info = preference_data(cfg, run.model, run.tokenizer, run.task, simulated_labeller(run), run.out_dir,
                                     heldout=False)
    # pairs written by the simulated labeller carry their gold scores; a user's own pairs do not
    info["gold"] = all("gold_chosen" in x.meta or "gold" in x.meta for x in train)
    final = train_dpo(cfg.algo, run.model, run.tokenizer, train, cfg.train.seed, run.sink)
    run.model.save_pretrained(run.out_dir / "policy")
    run.tokenizer.save_pretrained(run.out_dir / "policy")
    return {"prefs": info, "final": final}
