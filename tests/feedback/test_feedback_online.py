"""The online reward-model loop: pair choice by rule, the label/retrain bookkeeping over real HTTP
(every N labels, each label counted once), and a short end-to-end run with a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from sqlalchemy import select

from feedbackrl.algos.pair_selection import contrast_pairs
from feedbackrl.config import load_config
from feedbackrl.data.labeller import SimulatedLabeller
from feedbackrl.data.rows import read_jsonl
from feedbackrl.feedback.app import create_app
from feedbackrl.feedback.client import AdminApi, HttpLabeller
from feedbackrl.feedback.server import LiveServer
from feedbackrl.feedback.store import Label, create_labeller, open_db
from feedbackrl.log import JsonlSink
from feedbackrl.rewards.verdict import Problem
from feedbackrl.train.online_labels import Round, choose_pairs, online_loop, summarise
from feedbackrl.train.run import run

# Four prompts, K = 3. Least certain pairs: prompt 0 (0, 1) |diff| 0.5; prompt 1 none (one
# candidate); prompt 2 (1, 2) |diff| 0.1; prompt 3 (0, 2) |diff| 2.0.
SCORES = torch.tensor([[0.0, 0.5, 3.0], [1.0, 0.0, 0.0], [5.0, 1.0, 1.1], [0.0, 9.0, 2.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 1]])


def test_active_takes_the_least_certain_prompts_in_order():
    chosen, pairs = choose_pairs("active", SCORES, MASK, 2, torch.Generator().manual_seed(0))
    assert chosen.tolist() == [2, 0] and pairs.tolist() == [[1, 2], [0, 1]]


def test_contrast_takes_random_prompts_and_their_most_distinct_pair():
    for seed in range(5):
        rand, _ = choose_pairs("random", SCORES, MASK, 2, torch.Generator().manual_seed(seed))
        chosen, pairs = choose_pairs("contrast", SCORES, MASK, 2, torch.Generator().manual_seed(seed))
        assert chosen.tolist() == rand.tolist()  # the same prompts as random selection with that seed
        best = {0: [0, 2], 2: [0, 1], 3: [0, 1]}  # |diff| 3.0, 4.0 and 9.0: each prompt's widest pair
        assert pairs.tolist() == [best[b] for b in chosen.tolist()]


def test_runner_up_takes_random_prompts_and_their_top_two():
    for seed in range(5):
        rand, _ = choose_pairs("random", SCORES, MASK, 2, torch.Generator().manual_seed(seed))
        chosen, pairs = choose_pairs("runner_up", SCORES, MASK, 2, torch.Generator().manual_seed(seed))
        assert chosen.tolist() == rand.tolist()  # the same prompts as random selection with that seed
        top_two = {0: [1, 2], 2: [0, 2], 3: [1, 2]}  # 3.0 and 0.5; 5.0 and 1.1; 9.0 and 2.0
        assert top_two != {b: contrast_pairs(SCORES, MASK)[0][b].tolist() for b in top_two}  # not contrast
        assert pairs.tolist() == [top_two[b] for b in chosen.tolist()]


def test_widest_takes_the_prompts_with_the_widest_gap_first():
    # widest pair per prompt: 0 -> (0, 2) gap 3.0; 1 none; 2 -> (0, 1) gap 4.0; 3 -> (0, 1) gap 9.0
    chosen, pairs = choose_pairs("widest", SCORES, MASK, 2, torch.Generator().manual_seed(0))
    assert chosen.tolist() == [3, 2] and pairs.tolist() == [[0, 1], [0, 1]]
    chosen, _ = choose_pairs("widest", SCORES, MASK, 10, torch.Generator().manual_seed(0))
    assert chosen.tolist() == [3, 2, 0]  # never the prompt without a pair


def test_top_takes_the_prompts_whose_best_candidate_scores_highest():
    scores = torch.tensor([[10.0, 9.5, 9.0], [0.0, 5.0, 1.0], [7.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 0, 0]])  # prompt 2 has no pair
    gen = torch.Generator().manual_seed(0)
    chosen, pairs = choose_pairs("top", scores, mask, 3, gen)
    assert chosen.tolist() == [0, 1] and pairs.tolist() == [[0, 2], [0, 1]]  # best 10.0 then 5.0, each vs worst
    assert choose_pairs("widest", scores, mask, 3, gen)[0].tolist() == [1, 0]  # gaps 5.0 and 1.0


def test_bald_and_committee_need_their_evidence():
    with pytest.raises(ValueError, match="selection 'committee' needs"):
        choose_pairs("committee", SCORES, MASK, 2, torch.Generator().manual_seed(0))
    # committee: two members that agree everywhere except on prompt 3's pair (0, 1)
    members = torch.stack([SCORES, SCORES.clone()])
    members[1, 3, 1] = -9.0
    chosen, pairs = choose_pairs("committee", SCORES, MASK, 1, torch.Generator().manual_seed(0), members)
    assert chosen.tolist() == [3] and pairs.tolist() == [[0, 1]]


def test_random_and_mixed_never_take_a_prompt_without_a_pair_or_twice():
    for seed in range(20):
        chosen, _ = choose_pairs("random", SCORES, MASK, 3, torch.Generator().manual_seed(seed))
        assert sorted(chosen.tolist()) == [0, 2, 3]  # all usable prompts, prompt 1 never
        chosen, pairs = choose_pairs("mixed", SCORES, MASK, 2, torch.Generator().manual_seed(seed))
        assert chosen[0].item() == 2 and pairs[0].tolist() == [1, 2]  # n // 2 = 1 active: the least certain
        assert chosen[1].item() in (0, 3)  # then a random other usable prompt


def test_summary_counts_labels_to_reach_each_accuracy():
    rows = [{"labels": 0, "rm/heldout_accuracy": 0.7}, {"labels": 100, "rm/heldout_accuracy": 0.58},
            {"labels": 200, "rm/heldout_accuracy": 0.63}, {"labels": 300, "rm/heldout_accuracy": 0.61}]
    out = summarise(rows, (0.60, 0.65))
    # an untrained model that is right by chance does not count: labels > 0 only
    assert out == {"final_labels": 300, "final_accuracy": 0.61, "final_gold_agreement": None,
                   "labels_to_0.6": 200, "labels_to_0.65": None}


def test_label_gold_stats_count_agreement_and_ties():
    from feedbackrl.data.preferences import PreferencePair
    from feedbackrl.train.online_labels import label_gold_stats

    golds = [(1.0, 0.5), (0.2, 0.2), (0.0, 0.8)]  # agrees, a gold tie (counts one half), disagrees
    pairs = [PreferencePair("p", "c", "r", {"gold_chosen": c, "gold_rejected": r}) for c, r in golds]
    assert label_gold_stats(pairs) == {"labels/gold_agreement": 0.5, "labels/gold_ties": 1 / 3}


def reverse_gold(problem: Problem, completion: str) -> float:
    return float(completion == problem.answer)


def run_loop(sessions, tmp_path, labeller: SimulatedLabeller, propose, retrain, labels: int, every: int,
             ties: bool = False) -> tuple[list[dict], int]:
    """The real online loop against a live app, with the simulated labeller over HTTP; metrics go to
    tmp_path/metrics.jsonl. -> (every pair fetched, how many labels the labeller submitted)."""
    with sessions() as s:
        admin = create_labeller(s, "admin", is_admin=True)[1]
        s.commit()
    problems: dict[str, Problem] = {}
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    with LiveServer(create_app(sessions=sessions)) as server:
        api = AdminApi(server.url, admin)
        token = api.setup("online", "sim")
        worker = HttpLabeller(server.url, token, api.project, labeller, problems)
        worker.start()
        try:
            pairs = online_loop(api, problems, propose, retrain, labels, every, 60, sink, worker.check, ties=ties)
        finally:
            worker.stop.set()
            worker.join(timeout=10)
    sink.close()
    return pairs, worker.submitted


def test_loop_retrains_every_n_labels_and_counts_each_label_once(sessions, tmp_path):
    """25 labels, N = 10: rounds of 10, 10 and 5; retrain sees 0, 10, 20, 25 pairs, and the
    pairs are exactly the database's labels, each once. Noise-free labeller: always the reversal."""
    seen: list[list[int]] = []

    def propose(r: int, n: int) -> Round:
        words = [f"w{r}x{i}" for i in range(n)]
        problems = [Problem(f"{w}=", w[::-1]) for w in words]
        rows = [{"prompt": p.prompt, "responses": [p.prompt[:-1], p.answer]} for p in problems]
        return Round(rows, problems)

    def retrain(pairs: list[dict]) -> dict[str, float]:
        seen.append([p["label_id"] for p in pairs])
        return {"rm/heldout_accuracy": 0.5}

    pairs, submitted = run_loop(sessions, tmp_path, SimulatedLabeller(reverse_gold, 0.0), propose, retrain, 25, 10)
    assert [len(x) for x in seen] == [0, 10, 20, 25]
    assert all(seen[i] == seen[i + 1][: len(seen[i])] for i in range(3))  # each round only adds
    with sessions() as s:
        db_ids = s.scalars(select(Label.id).order_by(Label.id)).all()
    assert [p["label_id"] for p in pairs] == db_ids == seen[-1] and len(set(db_ids)) == 25
    assert submitted == 25 and all(p["chosen"] == p["prompt"][:-1][::-1] for p in pairs)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["labels"], r.get("new_pairs")) for r in rows] == [
        (0, 0, None), (1, 10, 10), (2, 20, 10), (3, 25, 5)]


def test_loop_counts_tie_answers_as_labels_and_fetches_them_as_tie_rows(sessions, tmp_path):
    """A pass/fail labeller with tie_margin 0: a pair of two wrong answers is a tie. 8 labels, N = 4:
    half the items are ties; every answer counts as a label, the ties come back marked "tie" (in
    the item's order) and are not counted as preference pairs."""
    seen: list[list[dict]] = []

    def propose(r: int, n: int) -> Round:
        problems = [Problem(f"w{r}x{i}=", f"{i}x{r}w") for i in range(n)]
        rows = [{"prompt": p.prompt, "responses": ["wrong", p.answer if i % 2 == 0 else "also wrong"]}
                for i, p in enumerate(problems)]
        return Round(rows, problems)

    def retrain(pairs: list[dict]) -> dict[str, float]:
        seen.append(list(pairs))
        return {"rm/heldout_accuracy": 0.5}

    labeller = SimulatedLabeller(reverse_gold, 0.0, tie_margin=0.0)
    pairs, submitted = run_loop(sessions, tmp_path, labeller, propose, retrain, 8, 4, ties=True)
    assert submitted == 8 and len(pairs) == 8 and [len(x) for x in seen] == [0, 4, 8]
    ties = [p for p in pairs if p.get("tie")]
    assert [(p["chosen"], p["rejected"]) for p in ties] == [("wrong", "also wrong")] * 4
    assert all(p["chosen"] == p["prompt"][:-1][::-1] for p in pairs if not p.get("tie"))  # the right answer
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["labels"], r["pairs"], r.get("tie_rows"), r.get("labels/no_preference")) for r in rows] == [
        (0, 0, None, None), (4, 2, 2, 0.5), (8, 4, 4, 0.5)]


def test_labeller_errors_stop_the_loop_instead_of_hanging(sessions, tmp_path):
    with sessions() as s:
        admin = create_labeller(s, "admin", is_admin=True)[1]
        s.commit()
    with LiveServer(create_app(sessions=sessions)) as server:
        api = AdminApi(server.url, admin)
        api.setup("online", "sim")
        worker = HttpLabeller(server.url, "wrong-token", api.project, SimulatedLabeller(reverse_gold, 0.0), {})
        worker.start()
        worker.join(timeout=10)
        assert isinstance(worker.error, httpx.HTTPStatusError) and worker.error.response.status_code == 401
        with pytest.raises(RuntimeError, match="the simulated labeller failed"):
            online_loop(api, {}, lambda r, n: Round([{"prompt": "ab=", "responses": ["ba", "ab"]}],
                                                    [Problem("ab=", "ba")]),
                        lambda pairs: {"rm/heldout_accuracy": 0.5}, 1, 1, 30, JsonlSink(tmp_path / "m.jsonl"),
                        worker.check)


def test_online_run_end_to_end_over_http(tiny_model_dir, tmp_path):
    cfg = load_config(None, ["algo.name='online_reward_model'",
        f"model.path={json.dumps(str(tiny_model_dir))}", "task.name=reverse", "rollout.max_new_tokens=6",
        "algo.epochs=1", "algo.batch_size=4", "online.labels=12", "online.retrain_every=6",
        "online.heldout_prompts=16", "online.pool=2", "train.threads=1"])
    report = run(cfg, tmp_path)["online"]
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r.get("phase") == "online"]
    assert [r["labels"] for r in rows] == [0, 6, 12] and report["labels"] == report["labeller_submitted"] == 12
    assert all(0 <= r["rm/heldout_accuracy"] <= 1 for r in rows) and report["heldout_pairs"] > 0
    with open_db(str(tmp_path / "labels.db"))() as s:
        labels = s.scalars(select(Label)).all()
    assert len(labels) == 12 and len({x.item_id for x in labels}) == 12


@pytest.mark.parametrize("rule", ["runner_up", "contrast", "bald", "committee"])
def test_model_driven_rules_run_in_the_loop(rule, tiny_model_dir, tmp_path):
    """runner_up, contrast, bald (Laplace posterior of the head) and committee (bootstrap members) choose
    round 2's pairs from a trained reward model; bald records the posterior variance of each chosen pair."""
    from feedbackrl.feedback.store import Item

    cfg = load_config(None, ["algo.name='online_reward_model'",
        f"model.path={json.dumps(str(tiny_model_dir))}", "task.name=reverse", "rollout.max_new_tokens=6",
        "algo.epochs=1", "algo.batch_size=4", "online.labels=12", "online.retrain_every=6",
        "online.heldout_prompts=16", "online.pool=2", "online.committee=2", "train.threads=1",
        f"online.selection={rule}"])
    report = run(cfg, tmp_path)["online"]
    assert report["labels"] == 12
    with open_db(str(tmp_path / "labels.db"))() as s:
        metas = [x.meta for x in s.scalars(select(Item)).all()]
    assert [m["selection"] for m in metas] == ["random"] * 6 + [rule] * 6
    if rule == "bald":
        assert all(m["rm_var"] > 0 for m in metas[6:])


def test_cli_names_a_bad_selection_rule(tmp_path):
    from typer.testing import CliRunner

    from feedbackrl.cli import app

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "online_rm.toml"
    result = CliRunner().invoke(app, ["train", str(recipe), "--out", str(tmp_path), "--set", "online.selection=best"])
    assert result.exit_code == 2
    assert ("online.selection: Input should be 'runner_up', 'contrast', 'widest', 'top', 'committee', 'bald', "
            "'active', 'random' or 'mixed' (got 'best')") in result.output
