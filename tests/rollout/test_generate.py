import math

import pytest
import torch
from fp32 import assert_logprobs_within_fp32

from feedbackrl.models.logprobs import positions, sequence_logprobs
from feedbackrl.rollout.generate import _top_p_filter, generate

# Different lengths, so the batch is left-padded.
PROMPTS = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello, world!"]


def hf_greedy(model, tokenizer, prompts: list[str], n: int) -> torch.Tensor:
    enc = tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=n, do_sample=False)
    return out[:, enc["input_ids"].shape[1] :]


def test_positions_start_at_zero_on_the_first_real_token():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 0]])
    assert positions(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3], [0, 0, 1, 1]]


def test_greedy_equals_hf_generate_on_a_left_padded_batch(peaked_lm, tokenizer):
    ro = generate(peaked_lm, tokenizer, PROMPTS, 8, greedy=True)
    assert (ro.prompt_mask == 0).any(), "the prompts should need left padding"
    expected = hf_greedy(peaked_lm, tokenizer, PROMPTS, 8)
    assert len(set(map(tuple, expected.tolist()))) == len(PROMPTS), "degenerate model: identical outputs"
    # HF pads finished rows with pad_token_id, as we do, and stops when every row has finished.
    assert torch.equal(ro.completion_ids, expected[:, : ro.completion_ids.shape[1]])


def test_greedy_does_not_depend_on_batch_padding(peaked_lm, tokenizer):
    batched = generate(peaked_lm, tokenizer, PROMPTS, 6, greedy=True)
    # float32 rounding differs with the padding: each run within its bound of a float64 run (tests/fp32.py)
    assert_logprobs_within_fp32(peaked_lm, batched.prompt_ids, batched.prompt_mask, batched.completion_ids,
                                batched.completion_mask, {"batched": batched.logprobs})
    for i, prompt in enumerate(PROMPTS):
        alone = generate(peaked_lm, tokenizer, [prompt], 6, greedy=True)
        assert alone.texts == [batched.texts[i]]
        assert_logprobs_within_fp32(peaked_lm, alone.prompt_ids, alone.prompt_mask, alone.completion_ids,
                                    alone.completion_mask, {f"{prompt!r} alone": alone.logprobs})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logprobs_equal_a_full_forward(peaked_lm, tokenizer, dtype):
    # Sampled at temperature 0.7: the KV-cached log-probs must be those of the tempered distribution
    # that sequence_logprobs (the training forward) recomputes in one pass. An off-by-one position or
    # a missing temperature gives errors of order 1. Float32: both within the float32 bound of a float64 run
    # (tests/fp32.py); float64: its rounding (~1e-15 relative) is far below 1e-7.
    model = peaked_lm.to(dtype)
    try:
        gen = torch.Generator().manual_seed(0)
        ro = generate(model, tokenizer, PROMPTS * 2, 8, temperature=0.7, generator=gen)
        with torch.no_grad():
            lp, ent = sequence_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                        temperature=0.7, with_entropy=True)
    finally:
        peaked_lm.float()
    if dtype == torch.float32:
        assert_logprobs_within_fp32(peaked_lm, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                    {"sampler": ro.logprobs, "training forward": lp}, temperature=0.7)
    else:
        torch.testing.assert_close(ro.logprobs, lp, rtol=0, atol=1e-7)
    assert (ro.logprobs[ro.completion_mask == 0] == 0).all()
    # the entropy is that of the tempered distribution: in (0, log V] on real tokens, 0 on padding
    real = ro.completion_mask.bool()
    assert (ent[real] > 0).all() and (ent[real] <= math.log(len(tokenizer)) + 1e-5).all()
    assert (ent[~real] == 0).all()


def test_masks_stop_after_eos(peaked_lm, tokenizer):
    # Near-uniform sampling (temperature 5) over 82 tokens: in 64 rows of 8 tokens some rows sample
    # EOS early and others run out of tokens.
    gen = torch.Generator().manual_seed(1)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ro = generate(peaked_lm, tokenizer, ["1+1="] * 64, 8, temperature=5.0, generator=gen)
    ended = (ro.completion_ids == eos).any(dim=1)
    assert ended.any() and (~ended).any(), "need rows with and without EOS"
    assert torch.equal(ro.truncated, ~ended)
    for ids, mask, lp, text in zip(ro.completion_ids, ro.completion_mask, ro.logprobs, ro.texts, strict=True):
        ids = ids.tolist()
        stop = ids.index(eos) + 1 if eos in ids else len(ids)  # EOS itself counts
        assert mask.tolist() == [1] * stop + [0] * (len(ids) - stop)
        assert ids[stop:] == [pad] * (len(ids) - stop)
        assert (lp[:stop] < 0).all() and (lp[stop:] == 0).all()
        # the text is the tokens before EOS; specials (EOS, and <unk>/<pad> if sampled) are dropped
        assert text == tokenizer.decode(ids[: stop - 1] if eos in ids else ids, skip_special_tokens=True)


def test_same_seed_same_samples_other_seed_other_samples(peaked_lm, tokenizer):
    def sample(seed: int):
        return generate(peaked_lm, tokenizer, PROMPTS, 6, generator=torch.Generator().manual_seed(seed))

    a, b, c = sample(0), sample(0), sample(1)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_generate_restores_training_mode(peaked_lm, tokenizer):
    peaked_lm.train()
    try:
        generate(peaked_lm, tokenizer, ["1+1="], 2, greedy=True)
        assert peaked_lm.training
    finally:
        peaked_lm.eval()


def test_tiny_top_p_sampling_is_greedy(peaked_lm, tokenizer):
    # Nucleus sampling with top_p -> 0 keeps only the most likely token. Log-probs are reported
    # before top-p filtering, so at temperature 1 they equal greedy's.
    greedy = generate(peaked_lm, tokenizer, PROMPTS, 6, greedy=True)
    nucleus = generate(peaked_lm, tokenizer, PROMPTS, 6, top_p=1e-6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(nucleus.completion_ids, greedy.completion_ids)
    torch.testing.assert_close(nucleus.logprobs, greedy.logprobs, rtol=0, atol=0)


def kept(logits: torch.Tensor, top_p: float) -> list[int]:
    return torch.isfinite(_top_p_filter(logits, top_p)).nonzero()[:, -1].tolist()


def test_top_p_keeps_the_smallest_prefix_reaching_top_p():
    # Probabilities (0.1, 0.6, 0.3) in token order; sorted: token 1 (0.6), token 2 (0.3), token 0 (0.1).
    # top_p 0.5: 0.6 >= 0.5 already -> {1}.  0.7: 0.6 < 0.7, 0.9 >= 0.7 -> {1, 2}.
    # 0.95: 0.9 < 0.95 -> all three.  1.0: no filtering.
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3]]))
    assert kept(logits, 0.5) == [1]
    assert kept(logits, 0.7) == [1, 2]
    assert kept(logits, 0.95) == [0, 1, 2]
    assert torch.equal(_top_p_filter(logits, 1.0), logits)
    # the kept logits are unchanged
    assert _top_p_filter(logits, 0.7)[0, 1:].tolist() == logits[0, 1:].tolist()


def test_top_p_boundary_is_exact():
    # Four equally likely tokens (exactly 0.25 each): 2 of them reach mass 0.5, so top_p 0.5 keeps 2,
    # and 0.75 keeps 3. Rows are filtered independently.
    logits = torch.zeros(2, 4)
    logits[1] = torch.log(torch.tensor([0.1, 0.6, 0.2, 0.1]))
    out = _top_p_filter(logits, 0.5)
    assert torch.isfinite(out[0]).sum() == 2
    assert torch.isfinite(out[1]).nonzero()[:, 0].tolist() == [1]
    assert torch.isfinite(_top_p_filter(torch.zeros(1, 4), 0.75)).sum() == 3


def test_all_done_decides_when_decoding_stops(tokenizer):
    # what the sharded learner's ranks rely on: a rank whose own rows are all done keeps decoding (same forward
    # calls as the others) until `all_done` says every rank's rows are, and its completions do not change
    from feedbackrl.models.tiny import build_model

    model = build_model(tokenizer, "tiny", seed=0)

    def sample(**kw):  # seed 5: both rows end early, the last at token 30 of 40
        return generate(model, tokenizer, ["ab", "abc"], 40, temperature=5.0,
                        generator=torch.Generator().manual_seed(5), **kw)

    alone, seen = sample(), []
    assert alone.completion_ids.shape[1] == 30 and alone.completion_mask.sum(1).tolist() == [13, 30]
    same = sample(all_done=lambda done: seen.append(done.clone()) or bool(done.all()))
    assert torch.equal(same.completion_ids, alone.completion_ids) and len(seen) == 30  # after tokens 1..30
    assert seen[12].tolist() == [True, False] and seen[11].tolist() == [False, False] and seen[29].all()
    held = sample(all_done=lambda done: False)  # another rank still has a row going: run to max_new_tokens
    assert held.completion_ids.shape[1] == 40
    assert torch.equal(held.completion_ids[:, :30], alone.completion_ids)
    assert (held.completion_ids[:, 30:] == tokenizer.pad_token_id).all()
    assert torch.equal(held.completion_mask[:, :30], alone.completion_mask) and not held.completion_mask[:, 30:].any()
    assert held.texts == alone.texts and torch.equal(held.logprobs[:, :30], alone.logprobs)
