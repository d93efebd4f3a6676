"""Reward models: the scalar is read at the last real token, save/reload gives identical scores,
and a learned reward source returns verdicts in [0, 1] with the raw score as evidence."""

import json
from pathlib import Path

import pytest
import torch

from feedbackrl.models.load import ModelLoadError, load_policy, load_tokenizer
from feedbackrl.models.reward import (
    MARKER,
    Calibration,
    RewardModel,
    build_reward_model,
    encode_texts,
    head_features,
    head_parameters,
    load_reward_model,
    save_reward_model,
    score_texts,
)
from feedbackrl.rewards.learned import LearnedReward
from feedbackrl.rewards.verdict import Problem

PROMPTS = ["abc=", "hgcaf=", "ab=", "jjjjjjj="]
RESPONSES = ["cba", "facgh", "abab", ""]


@pytest.fixture(params=["per_token", "last_token"])
def reward_model(tiny_model_dir: Path, request: pytest.FixtureRequest) -> RewardModel:
    torch.manual_seed(0)
    rm = build_reward_model(load_policy(str(tiny_model_dir)), head_type=request.param)
    with torch.no_grad():  # a head large enough that scores differ visibly between texts
        rm.head.weight.normal_(0, 1.0)
        rm.head.bias.normal_(0, 1.0)
    return rm.eval()


def test_encode_texts_left_pads_and_ends_every_row_with_eos(tokenizer):
    ids, mask, response_mask = encode_texts(tokenizer, PROMPTS, RESPONSES)
    assert (ids[:, -1] == tokenizer.eos_token_id).all() and (mask[:, -1] == 1).all()
    assert mask.sum(1).tolist() == [len(p) + len(r) + 1 for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    assert (ids[mask == 0] == tokenizer.pad_token_id).all()
    # the response and its EOS, right-aligned: "cba" + EOS is the last 4 columns of row 0
    assert response_mask.sum(1).tolist() == [len(r) + 1 for r in RESPONSES]
    assert tokenizer.decode(ids[0][response_mask[0] == 1][:-1]) == "cba"


def test_score_does_not_depend_on_padding(reward_model, tokenizer):
    # Scoring a row alone (no padding) or next to a longer one (left padding) gives the same score.
    alone = score_texts(reward_model, tokenizer, PROMPTS[:1], RESPONSES[:1])
    batched = score_texts(reward_model, tokenizer, PROMPTS, RESPONSES)
    torch.testing.assert_close(batched[:1], alone, atol=1e-5, rtol=1e-5)  # per_token scores are ~10-20
    assert batched.unique().numel() == len(PROMPTS)  # the texts really get different scores


def test_per_token_score_is_the_sum_of_next_token_reads(tiny_model_dir, tokenizer):
    # Slow path, one row at a time: run the backbone on prompt + response + EOS, and for each
    # response token x_t (EOS included) add W[x_t] . h_{t-1} + b[x_t].
    torch.manual_seed(1)
    rm = build_reward_model(load_policy(str(tiny_model_dir)), head_type="per_token").eval()
    with torch.no_grad():
        rm.head.weight.normal_(0, 1.0)
        rm.head.bias.normal_(0, 1.0)
        fast = score_texts(rm, tokenizer, PROMPTS, RESPONSES)
        for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
            ids = tokenizer(p + r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            h = rm.backbone.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # (L, H)
            slow = sum(rm.head.weight[ids[t]] @ h[t - 1] + rm.head.bias[ids[t]] for t in range(len(p), len(ids)))
            assert fast[i].item() == pytest.approx(slow.item(), abs=1e-4)


def test_untrained_per_token_head_scores_everything_zero(tiny_model_dir, tokenizer):
    rm = build_reward_model(load_policy(str(tiny_model_dir)))
    assert rm.head_type == "per_token" and rm.head.weight.shape == (rm.backbone.config.vocab_size,
                                                                     rm.backbone.config.hidden_size)
    assert score_texts(rm, tokenizer, PROMPTS, RESPONSES).abs().max().item() == 0.0


def test_a_marker_without_head_type_loads_the_last_token_head(tiny_model_dir, tokenizer, tmp_path):
    rm = build_reward_model(load_policy(str(tiny_model_dir)), head_type="last_token")
    path = save_reward_model(rm, tokenizer, tmp_path / "old")
    marker = json.loads((path / MARKER).read_text())
    del marker["head_type"]  # as written before the per-token head existed
    (path / MARKER).write_text(json.dumps(marker))
    again, _ = load_reward_model(path)
    assert again.head_type == "last_token"
    assert torch.equal(score_texts(again, tokenizer, PROMPTS, RESPONSES), score_texts(rm, tokenizer, PROMPTS,
                                                                                        RESPONSES))


def test_save_and_reload_give_identical_scores(reward_model, tokenizer, tmp_path):
    reward_model.kind = "cost"
    reward_model.calibration = Calibration(center=0.25, scale=2.0)
    path = save_reward_model(reward_model, tokenizer, tmp_path / "rm")
    marker = json.loads((path / MARKER).read_text())
    assert marker["kind"] == "cost" and marker["calibration"] == {"center": 0.25, "scale": 2.0}
    # the backbone directory is an ordinary HF causal LM
    assert load_policy(str(path)).config.model_type == "llama"
    again, tok = load_reward_model(path)
    assert again.kind == "cost" and again.calibration == Calibration(0.25, 2.0)
    assert torch.equal(score_texts(again, tok, PROMPTS, RESPONSES), score_texts(reward_model, tokenizer, PROMPTS,
                                                                                  RESPONSES))


def test_loading_a_plain_model_dir_says_what_to_do(tiny_model_dir):
    with pytest.raises(ModelLoadError, match="not a reward model directory"):
        load_reward_model(tiny_model_dir)


def test_calibration_is_a_sigmoid_of_the_standardised_score(reward_model):
    # raw 2.25 with center 0.25, scale 2 -> sigmoid(1) = 0.7310586
    reward_model.calibration = Calibration(0.25, 2.0)
    assert reward_model.calibrate(torch.tensor([2.25, 0.25])).tolist() == pytest.approx([0.7310586, 0.5], abs=1e-6)


def test_learned_reward_verdicts(reward_model, tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    raw = score_texts(reward_model, tok, PROMPTS, RESPONSES)
    reward_model.calibration = Calibration(center=raw.median().item(), scale=raw.std().item())
    source = LearnedReward(reward_model, tok)
    problems = [Problem(p, None, {}) for p in PROMPTS]
    verdicts = source.batch(problems, RESPONSES)
    for v, r in zip(verdicts, raw.tolist(), strict=True):
        assert 0.0 <= v.score <= 1.0
        assert v.details["raw"] == pytest.approx(r, abs=1e-5) and v.details["kind"] == "reward"
        assert v.passed == (v.score >= 0.5)
    assert {v.passed for v in verdicts} == {True, False}
    # one at a time gives the same verdict as the batch
    assert source(problems[1], RESPONSES[1]).score == pytest.approx(verdicts[1].score, abs=1e-5)
    # a cost model passes when the calibrated cost is below one half
    reward_model.kind = "cost"
    assert [v.passed for v in source.batch(problems, RESPONSES)] == [not v.passed for v in verdicts]


def test_reward_model_rejects_an_unknown_kind(tiny_model_dir):
    with pytest.raises(ValueError, match="'reward' or 'cost'"):
        RewardModel(load_policy(str(tiny_model_dir)), kind="value")
    with pytest.raises(ValueError, match="head_type must be one of"):
        RewardModel(load_policy(str(tiny_model_dir)), head_type="mean")


def test_head_features_are_linear_in_the_head(reward_model, tiny_model_dir):
    """score = head_features . head_parameters, for both heads (the Laplace posterior of `bald`
    rests on this), and an empty response scores only its EOS."""
    tokenizer = load_tokenizer(str(tiny_model_dir))
    with torch.no_grad():
        torch.nn.init.normal_(reward_model.head.weight, std=0.3)
        torch.nn.init.normal_(reward_model.head.bias, std=0.3)
    phi = head_features(reward_model, tokenizer, PROMPTS, RESPONSES, batch_size=3)  # two batches
    h, v = reward_model.backbone.config.hidden_size, reward_model.backbone.config.vocab_size
    assert phi.shape == (4, v * (h + 1) if reward_model.head_type == "per_token" else h + 1)
    torch.testing.assert_close(phi @ head_parameters(reward_model), score_texts(reward_model, tokenizer, PROMPTS,
                                                                                RESPONSES), rtol=1e-5, atol=1e-5)
    if reward_model.head_type == "per_token":  # the bias columns count each token: 3 letters + EOS in "cba"
        assert phi.view(4, v, h + 1)[0, :, h].sum().item() == 4.0
