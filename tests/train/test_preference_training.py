"""Preference training loops: DPO's reference log-probs are computed once, gradient accumulation
equals one big batch, a short reward-model training beats chance on held-out pairs, PPO and RLOO
run against a learned reward and log the gold reward next to it."""

import random
from pathlib import Path

import pytest
import torch

from feedbackrl.config import DPOConfig, RewardModelConfig, build_config
from feedbackrl.data.labeller import SimulatedLabeller, label_rows, reverse_gold, reverse_harm
from feedbackrl.data.preferences import PreferencePair, Ranking
from feedbackrl.envs.procedural.reverse import ReverseTask
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.logprobs import encode_prompts, sequence_logprobs
from feedbackrl.models.reward import build_reward_model
from feedbackrl.rewards.learned import LearnedReward
from feedbackrl.rewards.verdict import Problem
from feedbackrl.train import preference
from feedbackrl.train.grpo import ADVANTAGES, train_grpo
from feedbackrl.train.ppo import VALUE_HEAD_FILE, logprobs_and_values, make_value_head, train_ppo
from feedbackrl.train.prefs import gold_comparison, gold_scorer, training_reward


def reverse_pairs(n: int, seed: int = 0, heldout: bool = False) -> list[PreferencePair]:
    """chosen = the reversal; rejected = the reversal with 1-3 extra letters (the gold score's length penalty)."""
    task, rng = ReverseTask(), random.Random(seed)
    problems = task.heldout(n) if heldout else [task.sample(rng) for _ in range(n)]
    return [PreferencePair(p.prompt, p.answer, p.answer + "".join(rng.choice("abcdefghij")
                                                                  for _ in range(rng.randint(1, 3))))
            for p in problems]


def rankings(n: int) -> list[Ranking]:
    return [Ranking(p.prompt, [p.answer, p.answer[:-1], p.meta["word"]]) for p in
            (ReverseTask().sample(random.Random(i)) for i in range(n))]


def test_dpo_reference_logprobs_are_computed_once(tiny_model_dir):
    policy, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    reference = load_policy(str(tiny_model_dir))
    calls = []
    reference.register_forward_hook(lambda module, args, out: calls.append(1))
    policy_calls = []
    policy.register_forward_hook(lambda module, args, out: policy_calls.append(1))
    pairs = reverse_pairs(10)
    cfg = DPOConfig(epochs=3, batch_size=4, lr=1e-3)
    preference.train_dpo(cfg, policy, tok, pairs, seed=0, sink=MemorySink(), reference=reference)
    # 10 pairs fit one reference batch (256): one forward, although 3 epochs x 3 batches ran
    assert len(calls) == 1
    assert len(policy_calls) == 9  # 3 epochs x ceil(10 / 4) batches, one forward each


def test_dpo_without_a_reference_uses_the_policy_before_training(tiny_model_dir, monkeypatch):
    policy, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    items = preference.as_ranked(reverse_pairs(6))
    expected = preference.reference_logprobs(load_policy(str(tiny_model_dir)), tok, items)
    seen = {}
    original = preference.reference_logprobs

    def spy(reference, tokenizer, data, batch_size=256, average=False):
        seen["ref"] = original(reference, tokenizer, data, batch_size, average)
        return seen["ref"]

    monkeypatch.setattr(preference, "reference_logprobs", spy)
    preference.train_dpo(DPOConfig(epochs=1, batch_size=6), policy, tok, reverse_pairs(6), 0, MemorySink())
    torch.testing.assert_close(seen["ref"], expected)


@pytest.mark.parametrize("loss, make", [("dpo", lambda: reverse_pairs(8)), ("ipo", lambda: reverse_pairs(8)),
                                        ("pro", lambda: rankings(8))])
def test_gradient_accumulation_8x1_equals_1x8(tiny_model_dir, monkeypatch, loss, make):
    # Plain SGD with lr 1 makes the parameter change exactly minus the gradient (AdamW's first
    # step would hide gradient differences behind its sign-like normalisation).
    monkeypatch.setattr(preference, "adamw", lambda params, lr, weight_decay=0.0: torch.optim.SGD(params, lr=1.0))
    tok = load_tokenizer(str(tiny_model_dir))
    base = load_policy(str(tiny_model_dir)).state_dict()
    deltas = []
    for accum in (1, 8):
        model = load_policy(str(tiny_model_dir))
        cfg = DPOConfig(loss=loss, epochs=1, batch_size=8, grad_accum=accum, beta=0.5, max_grad_norm=1e9)
        preference.train_dpo(cfg, model, tok, make(), seed=0, sink=MemorySink(),
                             reference=load_policy(str(tiny_model_dir)))
        deltas.append({k: v - base[k] for k, v in model.state_dict().items()})
    # the reference is the initial policy, so the first step's gradient is the loss's gradient at h = 0: nonzero,
    # up to ~0.3 per parameter (DPO; ~2.3 for IPO); float32 summation order differs by ~1e-6 of that scale
    scale = max(d.abs().max().item() for d in deltas[0].values())
    assert scale > 1e-2
    for k in base:
        torch.testing.assert_close(deltas[1][k], deltas[0][k], rtol=1e-4, atol=max(1e-6, 2e-6 * scale), msg=k)


def test_dpo_rejects_rankings_for_a_pairwise_loss(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    with pytest.raises(ValueError, match="use algo.loss = 'pro'"):
        preference.train_dpo(DPOConfig(loss="dpo"), load_policy(str(tiny_model_dir)), tok, rankings(2), 0, MemorySink())


def test_short_reward_model_training_beats_chance_on_heldout_pairs(tiny_model_dir):
    torch.manual_seed(0)
    rm = build_reward_model(load_policy(str(tiny_model_dir)))
    tok = load_tokenizer(str(tiny_model_dir))
    train, held = reverse_pairs(512), reverse_pairs(128, heldout=True)
    before = preference.heldout_metrics(rm, tok, held)["rm/heldout_accuracy"]
    cfg = RewardModelConfig(epochs=1, batch_size=16, lr=1e-3)
    after = preference.train_reward_model(cfg, rm, tok, train, held, seed=0, sink=MemorySink())["rm/heldout_accuracy"]
    assert after >= 0.8, f"held-out pairwise accuracy {before:.3f} -> {after:.3f} after 32 steps; want >= 0.8"
    assert rm.calibration.scale > 0


def cost_pairs(n: int, seed: int = 0, heldout: bool = False) -> list[PreferencePair]:
    """Safety-labelled pairs from the noise-free safety labeller: a response with an "a" (the
    reverse task's harm rule) against the same length without one, in random order."""
    task, rng = ReverseTask(), random.Random(seed)
    problems = task.heldout(n) if heldout else [task.sample(rng) for _ in range(n)]
    labeller = SimulatedLabeller(reverse_harm, temperature=0.0, seed=seed, kind="cost")
    cands = []
    for p in problems:
        safe = "".join(rng.choice("bcdefghij") for _ in range(len(p.answer)))
        unsafe = list(safe)
        unsafe[rng.randrange(len(unsafe))] = "a"
        cands.append([safe, "".join(unsafe)] if rng.random() < 0.5 else ["".join(unsafe), safe])
    rows = label_rows(labeller, problems, cands, k=2)
    return [PreferencePair(r["prompt"], r["chosen"], r["rejected"], r) for r in rows]


def test_short_cost_model_training_beats_chance_and_learns_the_safe_side(tiny_model_dir):
    torch.manual_seed(0)
    model = build_reward_model(load_policy(str(tiny_model_dir)), kind="cost")
    tok = load_tokenizer(str(tiny_model_dir))
    train, held = cost_pairs(512), cost_pairs(128, heldout=True)
    before = preference.heldout_metrics(model, tok, held)
    cfg = RewardModelConfig(kind="cost", epochs=1, batch_size=16, lr=1e-3)
    rows = MemorySink()
    after = preference.train_reward_model(cfg, model, tok, train, held, seed=0, sink=rows)
    assert "loss/rm_safety" in rows.rows[1][1]  # the safety-labelled pairs train with the Safe RLHF loss
    for key in ("rm/heldout_accuracy", "rm/heldout_safety_accuracy"):
        assert after[key] >= 0.8, f"{key} {before[key]:.3f} -> {after[key]:.3f} after 32 steps; want >= 0.8"
    assert model.calibration.center == 0.0  # the loss puts the safe/unsafe boundary at cost 0
    # as a reward source: the score is the calibrated cost, `passed` means predicted safe
    source = LearnedReward(model, tok)
    problems = [ReverseTask._problem(p.prompt[:-1]) for p in held[:32]]
    verdicts = source.batch(problems, [p.rejected for p in held[:32]])  # the safe response of each pair
    assert source.name == "learned_cost" and all(0 < v.score < 1 for v in verdicts)
    assert sum(v.passed for v in verdicts) >= 24, [v.reason for v in verdicts]


def test_logprobs_and_values_match_sequence_logprobs(peaked_lm, tokenizer):
    prompts, completions = ["abc=", "hgcaf="], torch.tensor([[5, 6, 2], [7, 2, 0]])
    c_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    p_ids, p_mask = encode_prompts(tokenizer, prompts)
    want, _ = sequence_logprobs(peaked_lm, p_ids, p_mask, completions, c_mask, temperature=0.7)
    got, values, entropy = logprobs_and_values(peaked_lm, make_value_head(peaked_lm), p_ids, p_mask, completions,
                                               c_mask, temperature=0.7)
    torch.testing.assert_close(got, want)
    assert values.abs().sum() == 0  # zero-initialised head
    assert (entropy[c_mask == 0] == 0).all() and (entropy[c_mask == 1] > 0).all()


def online_config(name: str, reward_model_dir: Path):
    return build_config({"algo": {"name": name, "steps": 2}, "reward": {"model": str(reward_model_dir)},
                         "task": {"name": "reverse"},
                         "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
                         "train": {"seed": 0}})


@pytest.mark.parametrize("name", ["ppo", "rloo"])
def test_online_rl_against_a_learned_reward_logs_proxy_and_gold(tiny_model_dir, reward_model_dir, tmp_path, name):
    cfg = online_config(name, reward_model_dir)
    model, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    task = ReverseTask()
    rows = MemorySink()
    scoring = gold_scorer(training_reward(cfg, task), reverse_gold)
    golds = []  # each training batch's gold scores, recomputed from the completions the loop scored

    def scorer(problems, texts):
        golds.append([reverse_gold(p, t) for p, t in zip(problems, texts, strict=True)])
        return scoring(problems, texts)

    if name == "ppo":
        train_ppo(cfg, model, tok, task, tmp_path, rows, scorer)
        assert (tmp_path / "checkpoints" / "step_000002" / VALUE_HEAD_FILE).is_file()
    else:
        train_grpo(cfg, model, tok, task, tmp_path, rows, scorer=scorer)
    assert [s for s, _ in rows.rows] == [1, 2]
    assert len(golds) == 2
    for (_, m), gold in zip(rows.rows, golds, strict=True):
        assert 0 < m["reward/mean"] < 1  # the calibrated learned reward, not the (all-zero) verifier
        assert m["reward/gold_mean"] == sum(gold) / len(gold) and "reward/raw_mean" in m  # that step's gold
    moved = max((v - w).abs().max().item() for v, w in zip(model.state_dict().values(),
                                                             load_policy(str(tiny_model_dir)).state_dict().values(),
                                                             strict=True))
    assert moved > 0


def test_rloo_uses_leave_one_out_advantages():
    from feedbackrl.algos.advantages import group_advantages
    from feedbackrl.algos.rloo import rloo_advantages

    assert ADVANTAGES["grpo"] is group_advantages and ADVANTAGES["rloo"] is rloo_advantages


def test_gold_comparison_of_a_policy_with_itself_is_all_ties(peaked_lm, tokenizer):
    problems = ReverseTask().heldout(6)
    got = gold_comparison(peaked_lm, peaked_lm, tokenizer, problems, reverse_gold, max_new_tokens=6, temperature=1.0)
    assert got["win_rate"] == 0.5 and got["win_rate_greedy"] == 0.5
    assert got["gold_mean"] == got["baseline_gold_mean"] and got["prompts"] == 6


def test_gold_comparison_counts_wins_and_ties(monkeypatch, peaked_lm, tokenizer):
    # policy answers exactly (gold 1), baseline copies (gold < 1): every comparison is a win
    from feedbackrl.train import prefs

    problems = [ReverseTask._problem(w) for w in ("abcd", "hgcaf")]
    texts = {"policy": [p.answer for p in problems], "baseline": [p.meta["word"] for p in problems]}

    class FakeRollout:
        def __init__(self, t):
            self.texts = t

    def fake_generate(model, tokenizer, prompts, max_new_tokens, temperature=1.0, greedy=False, generator=None):
        who = "policy" if model == "P" else "baseline"
        n = len(prompts) // len(problems)
        return FakeRollout([t for t in texts[who] for _ in range(n)])

    monkeypatch.setattr(prefs, "generate", fake_generate)
    got = prefs.gold_comparison("P", "B", tokenizer, problems, reverse_gold, 6, 1.0, samples=3)
    assert got["win_rate"] == 1.0 and got["win_rate_greedy"] == 1.0
    assert got["accuracy"] == 1.0 and got["baseline_accuracy"] == 0.0
    # copies of abcd and hgcaf: 0.8 * 0/4 and 0.8 * 1/5 (the middle letter) -> mean 0.08
    assert got["baseline_gold_mean"] == pytest.approx(0.08)
    assert reverse_gold(Problem("x=", "dcba", {}), "abcd") == 0.0


def test_length_averaged_ipo_feeds_per_token_means(tiny_model_dir):
    """algo.length_average: each response's log-prob is its sum over its own tokens divided by their count
    (responses of different lengths in one padded batch), for the policy and the reference alike."""
    model, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    items = [("reverse abc:", ["cba", "cbaxyz"]), ("reverse hello:", ["olleh", "o"])]
    summed, mask = preference.ranked_logprobs(model, tok, items)
    averaged, _ = preference.ranked_logprobs(model, tok, items, average=True)
    # a response's tokens are its characters plus EOS (char tokenizer)
    counts = torch.tensor([[len(r) + 1 for r in rs] for _, rs in items], dtype=torch.float)
    torch.testing.assert_close(averaged, summed / counts)
    torch.testing.assert_close(preference.reference_logprobs(model, tok, items, average=True), averaged)
    with pytest.raises(ValueError, match="length_average is TRL's form of loss = 'ipo'"):
        DPOConfig(loss="dpo", length_average=True)
    assert DPOConfig(loss="ipo", length_average=True).length_average
