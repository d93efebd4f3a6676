"""The online reward-model loop: the policy proposes, a labeller judges over HTTP, the reward model
retrains, and the next items are chosen where the reward model is least sure.

`feedbackrl train recipes/online_rm.toml --out OUT` runs it (`algo.name = "online_reward_model"`,
options in `[online]`). It serves the labelling app, so it needs the feedback extra; the app
itself never imports this module.

One run:

1. Serve the labelling app (uvicorn on 127.0.0.1, in this process) on `online.db`
   (default OUT/labels.db). The operator's admin token is made directly in the database (as
   `feedbackrl label admin-token` does); everything after goes over HTTP: the project, the
   labeller and their invitation, items, status, export.
2. A simulated labeller (hidden gold score, Bradley-Terry noise; `data/labeller.py`) works
   through its own token in a background thread: `GET /next`, then `POST /labels`, like a person
   at the page. It knows each prompt's gold answer, and nothing the loop computes.
3. Rounds: sample `online.pool` x `retrain_every` prompts with up to `online.candidates` distinct
   responses each from the policy, score every candidate with the current reward model, choose
   `retrain_every` pairs (`online.selection`, below), post them as items, wait until the labeller
   has labelled them, fetch the new pairs (`GET /export?since_id=` the last label id seen),
   retrain the reward model from the policy on *all* pairs so far, and log the held-out pairwise
   accuracy on a fixed held-out set (and agreement with gold) against the number of labels.

Selection (`algos/pair_selection.py`; docs/human_feedback.md measures them): `random` takes
random prompts and a random pair of their candidates. `runner_up` takes the same random prompts
and, of each, the current reward model's best candidate against its runner-up: the two it is least
sure which is best. `contrast` takes them too, with the pair the model scores furthest apart;
`widest` takes that pair of the prompts where it is widest, `top` of the prompts whose best
candidate scores highest. `active` takes the prompts whose least certain pair (|P(a > b) - 0.5|
smallest) is least certain; `mixed` half of each round at random and half actively. `committee`
and `bald` take the prompts whose pair has the most mutual information between its label and the
model (BALD), under `online.committee` reward models trained on bootstrap resamples, or under a
Laplace posterior of the reward head. The first round is always random: an untrained reward model
has nothing to say.

OUT after a run: config.json, labels.db, metrics.jsonl (one row per round: labels, accuracy,
gold agreement, seconds), report.json.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.pair_selection import (
    committee_pairs,
    contrast_pairs,
    informative_pairs,
    laplace_factor,
    least_certain,
    pair_variance,
    random_pairs,
    runner_up_pairs,
    score_covariance,
    uncertain_pairs,
)
from feedbackrl.config import ConfigError, RunConfig
from feedbackrl.data.labeller import SimulatedLabeller, gold_score_for, label_ceiling, label_rows, sample_candidates
from feedbackrl.data.preferences import PreferencePair, load_preference_pairs
from feedbackrl.data.rows import read_jsonl
from feedbackrl.envs.base import Task
from feedbackrl.log import MetricsSink
from feedbackrl.models.reward import RewardModel, build_reward_model, head_features, head_parameters, score_texts
from feedbackrl.rewards.verdict import Problem
from feedbackrl.train.context import Run
from feedbackrl.train.preference import heldout_metrics, train_reward_model

Pairs = list[dict[str, Any]]
HELDOUT_SEED = 12345  # the held-out pairs are the same for every seed and selection rule


# --- the loop --------------------------------------------------------------------------------------


@dataclass
class Round:
    """What one round asks the labeller: item rows, and the problems behind their prompts."""

    rows: list[dict[str, Any]]
    problems: list[Problem]


Propose = Callable[[int, int], Round]  # (round index, pairs wanted) -> items to post
Retrain = Callable[[Pairs], dict[str, float]]  # all pairs so far -> held-out metrics


class LabelQueue:
    """The app's side of labelling rounds: post items, wait until they are answered, fetch the labels given
    since the last round, each once (the cursor is the highest label id seen; the export returns only newer
    labels). `online_loop` asks it once per round, as does the control loop's segment-preference learner
    (control/app_labels.py)."""

    def __init__(self, api: Any, wait_s: float, check: Callable[[], None] = lambda: None,
                 ties: bool = False) -> None:
        self.api, self.wait_s, self.check, self.ties = api, wait_s, check, ties
        self.cursor, self.answered = 0, 0

    def ask(self, rows: list[dict[str, Any]]) -> Pairs:
        """Post `rows` as items, block until every item so far is answered (a skip answers one), -> the new
        pairs (with the labeller's ties as rows marked "tie" if `ties`)."""
        self.api.add_items(rows)
        self.answered += len(rows)
        self.api.wait_for_labels(self.answered, self.wait_s, self.check)
        new = self.api.pairs_since(self.cursor, self.ties)
        ids = [row["label_id"] for row in new]
        if any(i <= self.cursor for i in ids) or len(set(ids)) != len(ids):
            raise RuntimeError(f"export since label {self.cursor} returned old or repeated labels: {ids[:10]}")
        self.cursor = max(ids, default=self.cursor)
        return new


def online_loop(api: Any, labeller_problems: dict[str, Problem], propose: Propose, retrain: Retrain,
                labels: int, every: int, wait_s: float, sink: MetricsSink,
                check: Callable[[], None] = lambda: None, ties: bool = False) -> Pairs:
    """Rounds of propose -> post -> wait for the labels -> fetch the new pairs -> retrain -> log.

    Each round asks for `min(every, labels left)` pairs; the loop ends when `labels` items have
    been answered, or when a round can propose nothing. Returns every pair fetched, each label
    once (`LabelQueue`), with the labeller's ties as rows marked "tie" if `ties`. Logged per round:
    `labels` answered (ties and skips included: the labeller's effort), `pairs` that state a
    preference, `tie_rows` fetched."""
    pairs: Pairs = []
    queue, t0 = LabelQueue(api, wait_s, check, ties), time.perf_counter()
    sink.log(0, {"phase": "online", "labels": 0, "pairs": 0, **retrain(pairs), "seconds": 0.0})
    r = 0
    while queue.answered < labels:
        r += 1
        t_round = time.perf_counter()
        batch = propose(r, min(every, labels - queue.answered))
        if not batch.rows:
            break
        labeller_problems.update({p.prompt: p for p in batch.problems})
        t_posted = time.perf_counter()
        new = queue.ask(batch.rows)
        t_labelled = time.perf_counter()
        pairs += new
        metrics = retrain(pairs)
        preferences = sum(not row.get("tie") for row in pairs)
        sink.log(r, {"phase": "online", "labels": queue.answered, "pairs": preferences,
                     "tie_rows": len(pairs) - preferences, "new_pairs": len(new),
                     "labels/no_preference": 1 - preferences / queue.answered,
                     **metrics, "seconds": time.perf_counter() - t0, "time/propose_s": t_posted - t_round,
                     "time/labels_s": t_labelled - t_posted, "time/retrain_s": time.perf_counter() - t_labelled})
    return pairs


# --- proposing and retraining ----------------------------------------------------------------------


def flat_candidates(problems: list[Problem], candidates: list[list[str]],
                    k: int) -> tuple[torch.Tensor, list[str], list[str]]:
    """-> the (B, K) mask of real candidates, and every candidate's prompt and text in mask order
    (`grid[mask] = per_candidate` puts per-candidate values back in their (B, K) places)."""
    mask = torch.tensor([[j < len(c) for j in range(k)] for c in candidates])
    flat = [(p.prompt, c) for p, cs in zip(problems, candidates, strict=True) for c in cs]
    return mask, [x for x, _ in flat], [y for _, y in flat]


def candidate_scores(rm: RewardModel | None, tokenizer: PreTrainedTokenizerBase, problems: list[Problem],
                     candidates: list[list[str]], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, K) raw scores of every candidate (zeros without a reward model) and the (B, K) mask."""
    mask, prompts, responses = flat_candidates(problems, candidates, k)
    scores = torch.zeros(len(candidates), k)
    if rm is not None and prompts:
        scores[mask] = score_texts(rm, tokenizer, prompts, responses)
    return scores, mask


def choose_pairs(selection: str, scores: torch.Tensor, mask: torch.Tensor, n: int, generator: torch.Generator,
                 evidence: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (prompt indices (m,), pairs (m, 2)), m <= n, by the rule `selection` (see the module docstring).
    `evidence` is what the BALD rules need besides the scores: for `bald` the (P, K, K) posterior
    covariance of the scores, for `committee` the (E, P, K) scores of every member."""
    usable = torch.nonzero(mask.sum(1) >= 2).squeeze(1)
    shuffled = usable[torch.randperm(len(usable), generator=generator)]
    rand_pairs = random_pairs(mask, generator)
    if selection == "random":
        chosen = shuffled[:n]
        return chosen, rand_pairs[chosen]
    if selection == "contrast":  # random prompts, the pair the model scores furthest apart
        chosen = shuffled[:n]
        return chosen, contrast_pairs(scores, mask)[0][chosen]
    if selection == "runner_up":  # random prompts, the model's best candidate and its runner-up
        chosen = shuffled[:n]
        return chosen, runner_up_pairs(scores, mask)[chosen]
    if selection in ("widest", "top"):  # best vs worst candidate, of the prompts where that gap is widest,
        pairs, gap = contrast_pairs(scores, mask)  # or whose best candidate scores highest
        key = gap if selection == "widest" else scores.masked_fill(~mask.bool(), float("-inf")).amax(1)
        chosen = least_certain(-key.masked_fill(gap == float("-inf"), float("-inf")), n)  # no pair: dropped
        return chosen, pairs[chosen]
    if selection in ("bald", "committee"):
        if evidence is None:
            raise ValueError(f"selection {selection!r} needs its evidence: the score covariance (bald) or the "
                             "committee's scores (committee)")
        pairs, info = (informative_pairs(scores, evidence, mask) if selection == "bald"
                       else committee_pairs(evidence, mask))
        chosen = least_certain(-info, n)  # the most informative first; -inf (no pair) is dropped
        return chosen, pairs[chosen]
    act_pairs, certainty = uncertain_pairs(scores, mask)
    n_active = n if selection == "active" else n // 2
    active = least_certain(certainty, n_active)
    rest = shuffled[~torch.isin(shuffled, active)][: n - len(active)]
    chosen = torch.cat([active, rest])
    pairs = torch.cat([act_pairs[active], rand_pairs[rest]])
    return chosen, pairs


@dataclass
class Fitted:
    """The latest reward model and the pairs it was trained on (the posterior of `bald` needs both)."""

    rm: RewardModel
    pairs: list[PreferencePair]
    members: list[RewardModel]  # the committee besides rm (selection "committee"), else empty


def candidate_covariance(fitted: Fitted, tokenizer: PreTrainedTokenizerBase, problems: list[Problem],
                         candidates: list[list[str]], k: int, prior_precision: float) -> torch.Tensor:
    """(P, K, K) posterior covariance of the candidates' scores under the last-layer Laplace
    approximation of the head (algos/pair_selection.py); rows and columns of missing candidates are 0."""
    rm, train = fitted.rm, fitted.pairs
    prompts = [p.prompt for p in train]
    phi = head_features(rm, tokenizer, prompts + prompts, [p.chosen for p in train] + [p.rejected for p in train])
    diffs = phi[: len(train)] - phi[len(train) :]
    factor = laplace_factor(diffs, diffs @ head_parameters(rm), prior_precision)
    del phi, diffs
    mask, prompts, responses = flat_candidates(problems, candidates, k)
    feats = head_features(rm, tokenizer, prompts, responses)
    grid = feats.new_zeros(len(candidates), k, feats.shape[1])
    grid[mask] = feats
    return score_covariance(grid, factor, prior_precision)


def make_proposer(cfg: RunConfig, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                  current: Callable[[], Fitted | None]) -> Propose:
    o, seed = cfg.online, cfg.train.seed
    prompt_rng, gen = random.Random(seed + 2), torch.Generator().manual_seed(seed + 1)
    pick_gen = torch.Generator().manual_seed(seed + 4)

    def propose(round_index: int, n: int) -> Round:
        problems = [task.sample(prompt_rng) for _ in range(o.pool * n)]
        cands = sample_candidates(policy, tokenizer, problems, o.candidates, cfg.rollout.max_new_tokens,
                                  cfg.rollout.temperature, gen)
        fitted = current() if round_index > 1 else None
        scores, mask = candidate_scores(fitted and fitted.rm, tokenizer, problems, cands, o.candidates)
        rule = o.selection if fitted is not None else "random"
        evidence = None
        if fitted is not None and rule == "bald":
            evidence = candidate_covariance(fitted, tokenizer, problems, cands, o.candidates, o.prior_precision)
        elif fitted is not None and rule == "committee":  # (E, P, K): every member's scores
            evidence = torch.stack([scores] + [candidate_scores(m, tokenizer, problems, cands, o.candidates)[0]
                                               for m in fitted.members])
        chosen, pairs = choose_pairs(rule, scores, mask, n, pick_gen, evidence)
        # bald: the posterior variance of r_first - r_second of each chosen pair
        var = (pair_variance(evidence[chosen], pairs[:, 0], pairs[:, 1]).diagonal().tolist()
               if rule == "bald" else None)
        rows, picked = [], []
        for m, (b, (i, j)) in enumerate(zip(chosen.tolist(), pairs.tolist(), strict=True)):
            p = torch.sigmoid(scores[b, i] - scores[b, j]).item()
            rows.append({"prompt": problems[b].prompt, "responses": [cands[b][i], cands[b][j]],
                         "round": round_index, "selection": rule, "rm_p_first": p})
            if var is not None:
                rows[-1]["rm_var"] = var[m]
            picked.append(problems[b])
        return Round(rows, picked)

    return propose


def heldout_pairs(cfg: RunConfig, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                  task: Task) -> list[PreferencePair]:
    """One labelled pair per held-out prompt with two distinct samples, fixed across seeds and rules;
    with `online.tie_margin`, without the pairs the labeller would call a tie (they have no answer)."""
    problems = task.heldout(cfg.online.heldout_prompts)
    gen = torch.Generator().manual_seed(HELDOUT_SEED)
    cands = sample_candidates(policy, tokenizer, problems, 2, cfg.rollout.max_new_tokens, cfg.rollout.temperature, gen)
    labeller = SimulatedLabeller(gold_score_for(task, cfg.online.gold), cfg.online.temperature, seed=HELDOUT_SEED,
                        tie_margin=cfg.online.tie_margin)
    rows = [r for r in label_rows(labeller, problems, cands, 2)
            if not labeller.ties(r["gold_chosen"], r["gold_rejected"])]
    return load_preference_pairs(rows)[0]


def with_gold(rows: Pairs, problems: dict[str, Problem], task: Task, gold_kind: str = "task") -> list[PreferencePair]:
    """Exported pairs -> PreferencePairs with the gold columns (for measuring only, never training)."""
    gold = gold_score_for(task, gold_kind)
    out = []
    for row in rows:
        problem = problems[row["prompt"]]
        out.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"],
                                  {**row, "gold_chosen": gold(problem, row["chosen"]),
                                   "gold_rejected": gold(problem, row["rejected"])}))
    return out


def label_gold_stats(pairs: list[PreferencePair]) -> dict[str, float]:
    """How informative the labels so far are: the share that agree with gold, and of gold ties
    (tie answers, which state no order, are left out)."""
    pairs = [p for p in pairs if not p.meta.get("tie")]
    if not pairs:
        return {}
    ceiling = label_ceiling([{**p.meta, "p_chosen": 0.5} for p in pairs])
    ties = sum(p.meta["gold_chosen"] == p.meta["gold_rejected"] for p in pairs) / len(pairs)
    return {"labels/gold_agreement": ceiling["realised"], "labels/gold_ties": ties}


def summarise(rows: list[dict[str, Any]], thresholds: tuple[float, ...]) -> dict[str, Any]:
    """Labels needed to first reach each held-out accuracy (None if never), and the final numbers.

    Only trained models count (pairs > 0): an untrained head can be right by chance."""
    out: dict[str, Any] = {"final_labels": rows[-1]["labels"], "final_accuracy": rows[-1]["rm/heldout_accuracy"],
                           "final_gold_agreement": rows[-1].get("rm/heldout_gold_agreement")}
    trained = [r for r in rows if r.get("pairs", r["labels"]) > 0]
    for x in thresholds:
        out[f"labels_to_{x:g}"] = next((r["labels"] for r in trained if r["rm/heldout_accuracy"] >= x), None)
    return out


# --- the run ---------------------------------------------------------------------------------------


ACCURACY_MARKS = (0.65, 0.70, 0.75)  # labels-to-reach is reported for these held-out accuracies


class _NullSink:
    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def fit_reward_model(cfg: RunConfig, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                     pairs: list[PreferencePair], seed: int) -> RewardModel:
    """A reward model started from the policy (the InstructGPT initialisation) and trained on `pairs`
    with `seed` (untrained if there are none)."""
    torch.manual_seed(seed)
    rm = build_reward_model(policy, cfg.algo.kind, cfg.algo.head)
    if pairs:
        # no held-out set inside: it would be scored after every epoch; once per round is enough
        train_reward_model(cfg.algo, rm, tokenizer, pairs, [], seed, _NullSink())
    return rm


def bootstrap_members(cfg: RunConfig, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                      pairs: list[PreferencePair]) -> list[RewardModel]:
    """The committee besides the logged model: `online.committee - 1` reward models, each on a
    bootstrap resample of the pairs (Efron 1979) with its own seed and data order, in eval mode."""
    members = []
    for e in range(1, cfg.online.committee):
        rng = random.Random(f"{cfg.train.seed}-{e}-{len(pairs)}")
        resample = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        members.append(fit_reward_model(cfg, policy, tokenizer, resample, cfg.train.seed + e).eval())
    return members


def make_retrainer(cfg: RunConfig, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                   heldout: list[PreferencePair],
                   problems: dict[str, Problem]) -> tuple[Retrain, Callable[[], Fitted | None]]:
    """-> (retrain: all pairs so far -> metrics, current: the latest reward model and its pairs, or None).

    Each retrain starts again from the policy (the InstructGPT initialisation) with the same seed,
    so a round's model depends only on the pairs, not on the path that led to them."""
    state: dict[str, Fitted | None] = {"fitted": None}

    def retrain(rows: Pairs) -> dict[str, float]:
        pairs = with_gold(rows, problems, task, cfg.online.gold)
        rm = fit_reward_model(cfg, policy, tokenizer, pairs, cfg.train.seed)
        if pairs:
            members = bootstrap_members(cfg, policy, tokenizer, pairs) if cfg.online.selection == "committee" else []
            state["fitted"] = Fitted(rm, pairs, members)
        return {**heldout_metrics(rm, tokenizer, heldout), **label_gold_stats(pairs)}

    return retrain, lambda: state["fitted"]


def run_online_labels(run: Run) -> dict[str, Any]:
    """The whole loop (see the module docstring) from the run's (SFT) policy -> the report's "online" section."""
    try:
        from feedbackrl.feedback.app import create_app
        from feedbackrl.feedback.client import AdminApi, HttpLabeller
        from feedbackrl.feedback.server import LiveServer
        from feedbackrl.feedback.store import create_labeller, open_db
    except ImportError as e:
        raise ConfigError(f"algo.name = 'online_reward_model' serves the labelling app and needs the feedback extra "
                          f"({e.name} is missing): pip install -e '.[feedback]'") from None

    cfg, policy, tokenizer, task, sink = run.cfg, run.model, run.tokenizer, run.task, run.sink
    policy.eval()
    heldout = heldout_pairs(cfg, policy, tokenizer, task)
    ceiling = label_ceiling([p.meta for p in heldout])
    sessions = open_db(cfg.online.db or str(run.out_dir / "labels.db"))
    with sessions() as s:  # the operator's token, as `feedbackrl label admin-token` makes it
        admin = create_labeller(s, f"online-admin-{uuid.uuid4().hex[:8]}", is_admin=True)[1]
        s.commit()
    problems: dict[str, Problem] = {}
    retrain, current = make_retrainer(cfg, policy, tokenizer, task, heldout, problems)
    propose = make_proposer(cfg, policy, tokenizer, task, current)
    labeller = SimulatedLabeller(gold_score_for(task, cfg.online.gold), cfg.online.temperature, seed=cfg.train.seed + 3,
                        tie_margin=cfg.online.tie_margin)
    with LiveServer(create_app(sessions=sessions)) as server:
        api = AdminApi(server.url, admin)
        token = api.setup(f"online-{cfg.online.selection}-{uuid.uuid4().hex[:8]}", f"sim-{uuid.uuid4().hex[:8]}")
        worker = HttpLabeller(server.url, token, api.project, labeller, problems)
        worker.start()
        try:
            online_loop(api, problems, propose, retrain, cfg.online.labels, cfg.online.retrain_every,
                        cfg.online.wait_s, sink, worker.check, cfg.online.train_on_ties)
        finally:
            worker.stop.set()
            worker.join(timeout=10)
            api.http.close()
    sessions.kw["bind"].dispose()
    rows = [r for r in read_jsonl(run.out_dir / "metrics.jsonl") if r.get("phase") == "online"]
    return {"online": {"selection": cfg.online.selection, "seed": cfg.train.seed, "project_id": api.project,
                       "labels": rows[-1]["labels"], "pairs": rows[-1]["pairs"], "heldout_pairs": len(heldout),
                       "heldout_ceiling": ceiling, "labeller_submitted": worker.submitted,
                       **summarise(rows, ACCURACY_MARKS),
                       "curve": [[r["labels"], r["rm/heldout_accuracy"]] for r in rows]}}
