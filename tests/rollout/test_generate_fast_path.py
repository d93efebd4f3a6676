"""The fast decode path (`_LlamaDecoder`) against the generic one (the model's own forward + DynamicCache).

Both must pick the same tokens and report the same log-probs up to float32 rounding: the fast path
only reorganises the work (static cache, fused matmuls), it never changes the maths.
"""

import copy

import pytest
import torch
from fp32 import assert_logprobs_within_fp32, decoder_logprob_tolerance, probabilistic_gamma, reduction_length

from feedbackrl.models.logprobs import encode_prompts, fast_path_ok, positions, sequence_logprobs
from feedbackrl.rollout import generate as gen_mod
from feedbackrl.rollout.generate import _empty_huge_pages, _sample, generate

PROMPTS = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello, world!"]  # different lengths: left padding


def generic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gen_mod, "fast_path_ok", lambda model: False)


@pytest.mark.parametrize("model_name", ["peaked_lm", "peaked_qwen"])
def test_fast_path_samples_what_the_generic_path_samples(model_name, tokenizer, request, monkeypatch):
    model = request.getfixturevalue(model_name)
    assert fast_path_ok(model)
    fast = generate(model, tokenizer, PROMPTS * 4, 10, temperature=0.8, generator=torch.Generator().manual_seed(3))
    generic(monkeypatch)
    slow = generate(model, tokenizer, PROMPTS * 4, 10, temperature=0.8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(fast.completion_ids, slow.completion_ids)
    # both within float32 rounding of a float64 run, whatever the CPU's summation order (tests/fp32.py)
    assert_logprobs_within_fp32(model, fast.prompt_ids, fast.prompt_mask, fast.completion_ids, fast.completion_mask,
                                {"fast": fast.logprobs, "generic": slow.logprobs}, temperature=0.8)
    assert fast.texts == slow.texts


@pytest.mark.parametrize("model_name", ["peaked_lm", "peaked_qwen"])
def test_fast_path_greedy_equals_hf_generate(model_name, tokenizer, request):
    model = request.getfixturevalue(model_name)
    enc = tokenizer(PROMPTS, padding=True, add_special_tokens=False, return_tensors="pt")
    expected = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    expected = expected[:, enc["input_ids"].shape[1]:]
    ro = generate(model, tokenizer, PROMPTS, 8, greedy=True)
    assert len(set(map(tuple, expected.tolist()))) == len(PROMPTS), "degenerate model: identical outputs"
    assert torch.equal(ro.completion_ids, expected[:, : ro.completion_ids.shape[1]])


def test_prompts_without_padding_skip_the_mask_and_agree(peaked_lm, tokenizer, monkeypatch):
    # Equal-length prompts take the no-mask branch (causal prefill, unmasked decode).
    prompts = ["12+34=", "56+78=", "90+12="] * 3
    fast = generate(peaked_lm, tokenizer, prompts, 8, generator=torch.Generator().manual_seed(0))
    generic(monkeypatch)
    slow = generate(peaked_lm, tokenizer, prompts, 8, generator=torch.Generator().manual_seed(0))
    assert (fast.prompt_mask == 1).all()
    assert torch.equal(fast.completion_ids, slow.completion_ids)
    assert_logprobs_within_fp32(peaked_lm, fast.prompt_ids, fast.prompt_mask, fast.completion_ids,
                                fast.completion_mask, {"fast": fast.logprobs, "generic": slow.logprobs})


def test_min_new_tokens_suppresses_eos_but_reports_unbanned_logprobs(peaked_lm, tokenizer):
    # Temperature 5 over 82 tokens: without the ban, some of 64 rows would sample EOS within 6 steps
    # (test_masks_stop_after_eos relies on this). Log-probs stay those of the unbanned distribution,
    # i.e. what a training forward computes.
    eos = tokenizer.eos_token_id
    ro = generate(peaked_lm, tokenizer, ["1+1="] * 64, 6, temperature=5.0, min_new_tokens=6,
                  generator=torch.Generator().manual_seed(1))
    assert not (ro.completion_ids == eos).any() and ro.completion_mask.all() and ro.truncated.all()
    with torch.no_grad():
        lp, _ = sequence_logprobs(peaked_lm, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                  temperature=5.0)
    assert_logprobs_within_fp32(peaked_lm, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                {"sampler": ro.logprobs, "training forward": lp}, temperature=5.0)


def test_min_new_tokens_only_bans_the_first_steps(peaked_lm, tokenizer):
    ro = generate(peaked_lm, tokenizer, ["1+1="] * 64, 8, temperature=5.0, min_new_tokens=2,
                  generator=torch.Generator().manual_seed(1))
    ended = ro.completion_ids == tokenizer.eos_token_id
    assert not ended[:, :2].any() and ended.any()


def test_fast_path_only_for_unmodified_float32_llama_family(peaked_lm):
    assert fast_path_ok(peaked_lm)
    handle = peaked_lm.model.layers[0].mlp.up_proj.register_forward_hook(lambda *a: None)
    try:
        assert not fast_path_ok(peaked_lm), "a hook (e.g. an adapter) changes the maths"
    finally:
        handle.remove()
    try:
        assert not fast_path_ok(peaked_lm.double()), "HF's RMSNorm runs in float32 even for float64 models"
    finally:
        peaked_lm.float()


def test_sample_never_picks_zero_probability_tokens_and_matches_frequencies():
    # Row 0: tokens 0 and 3 have probability 0 (first and last, the CDF's edges); row 1: one-hot on
    # token 2. 20,000 draws of row 0: frequencies within 4 standard errors of (0, 0.2, 0.8, 0).
    probs = torch.tensor([[0.0, 0.2, 0.8, 0.0], [0.0, 0.0, 1.0, 0.0]]).repeat(10_000, 1)
    picks = _sample(probs, torch.Generator().manual_seed(0)).view(10_000, 2)
    assert (picks[:, 1] == 2).all()
    counts = torch.bincount(picks[:, 0], minlength=4)
    assert counts[0] == 0 and counts[3] == 0
    se = (0.2 * 0.8 / 10_000) ** 0.5
    assert abs(counts[1].item() / 10_000 - 0.2) < 4 * se, counts


def test_sequence_logprobs_ignore_completion_padding(peaked_lm, tokenizer):
    # Rows stop at EOS; tokens after it are padding. Masking only the prompt must give the real tokens
    # the same log-probs as masking the completion padding too (causal attention never looks right).
    ro = generate(peaked_lm, tokenizer, PROMPTS * 8, 8, temperature=5.0, generator=torch.Generator().manual_seed(1))
    assert (ro.completion_mask == 0).any(), "need padded completions"
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], dim=1)
    mask = torch.cat([ro.prompt_mask, ro.completion_mask], dim=1)
    p = ro.prompt_ids.shape[1]
    with torch.no_grad():
        logits = peaked_lm(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
        want = torch.log_softmax(logits[:, p - 1 : -1] / 5.0, -1).gather(-1, ro.completion_ids[..., None])[..., 0]
        got, _ = sequence_logprobs(peaked_lm, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                   temperature=5.0)
    assert_logprobs_within_fp32(peaked_lm, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                {"completion padding masked": got, "prompt padding only": want * ro.completion_mask},
                                temperature=5.0)


def test_huge_page_buffers_are_plain_writable_tensors():
    # 6 MB takes the mmap branch (the KV cache), 80 bytes plain torch.empty; both behave as torch.empty.
    for shape in [(3, 1 << 19), (4, 5)]:
        t = _empty_huge_pages(shape, torch.float32)
        assert t.shape == shape and t.dtype == torch.float32 and t.is_contiguous()
        t.fill_(2.0)
        assert t.sum().item() == 2.0 * t.numel()


def _kv_tolerance(model64, ids, mask) -> float:
    """A bound on how far two float32 runs' cached keys and values may differ, from the float64 copy.

    A key or value is a projection of the normed hidden state, rotated (RoPE: |cos| + |sin| <= 2) for keys;
    S, the largest sum_h |x_h| |W_h| + |b| over layers and positions, scales its error, into which every earlier
    sum's error has been carried, as for the logits in tests/fp32.py: each side within probabilistic_gamma(n) * 2S.
    """
    with torch.no_grad():
        out = model64(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False,
                      output_hidden_states=True)
        s = 0.0
        for layer, h in zip(model64.base_model.layers, out.hidden_states[:-1], strict=True):
            x = layer.input_layernorm(h).abs()
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                mag = x @ proj.weight.abs().T + (0 if proj.bias is None else proj.bias.abs())
                s = max(s, mag.max().item())
    return 2 * probabilistic_gamma(reduction_length(model64.config, ids.shape[1])) * 2 * s


@pytest.mark.parametrize("model_name", ["peaked_lm", "peaked_qwen"])
def test_prefill_runs_each_distinct_prompt_once_and_fills_every_row(model_name, tokenizer, request, monkeypatch):
    # GRPO repeats every prompt G times: the prefill runs the distinct ones and copies their keys and values
    model = request.getfixturevalue(model_name)
    prompts = ["7+85=", "Hello, world!", "7+85=", "1+1=", "Hello, world!", "7+85="]  # repeats, not adjacent
    ids, mask = encode_prompts(tokenizer, prompts)
    pos = positions(mask)
    with torch.no_grad():
        shared = gen_mod._LlamaDecoder(model, mask, 4)
        logits = shared.prefill(ids, pos)
        monkeypatch.setattr(gen_mod, "shared_prompts", lambda *a: None)
        per_row = gen_mod._LlamaDecoder(model, mask, 4)
        want = per_row.prefill(ids, pos)
        p = ids.shape[1]
        # two float32 runs of the same logits, each within half the log-prob bound of float64 (tests/fp32.py)
        tol = decoder_logprob_tolerance(copy.deepcopy(model).double(), ids, mask)
        torch.testing.assert_close(logits, want, rtol=0, atol=tol)
        kv_tol = _kv_tolerance(copy.deepcopy(model).double(), ids, mask)
        for (kv, _, _), (kv_want, _, _) in zip(shared.cache, per_row.cache, strict=True):
            torch.testing.assert_close(kv[..., :p, :], kv_want[..., :p, :], rtol=0, atol=kv_tol)
        step = torch.full((len(prompts), 1), 5)  # and the next step sees the same cache
        torch.testing.assert_close(shared(step, pos[:, -1:] + 1), per_row(step, pos[:, -1:] + 1), rtol=0, atol=tol)


def test_autocast_takes_the_models_own_forward(peaked_lm, tokenizer):
    """Under bf16 autocast the fast paths (float32 buffers, custom autograd functions) step aside."""
    ro = generate(peaked_lm, tokenizer, PROMPTS, 4, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fast_path_ok(peaked_lm)
        lp, _ = sequence_logprobs(peaked_lm, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
        lp.sum().backward()  # crashed in the fast path's custom backward (mixed dtypes)
        again = generate(peaked_lm, tokenizer, PROMPTS, 4, generator=torch.Generator().manual_seed(0))
    peaked_lm.zero_grad(set_to_none=True)
    assert fast_path_ok(peaked_lm)
    assert again.completion_ids.shape[0] == len(PROMPTS)
    torch.testing.assert_close(lp.float(), sequence_logprobs(peaked_lm, ro.prompt_ids, ro.prompt_mask,
                                                             ro.completion_ids, ro.completion_mask)[0].detach(),
                               rtol=0, atol=0.2)  # bf16 matmuls: close, not equal


def test_an_empty_prompt_generates_and_scores_as_hf(peaked_lm, tokenizer):
    """An all-padding row: HF attends uniformly over its all-masked keys; such batches take HF's forward."""
    prompts = ["", "1+1=", "12+3="]
    enc = tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="pt")
    expected = peaked_lm.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    ro = generate(peaked_lm, tokenizer, prompts, 6, greedy=True)
    assert torch.equal(ro.completion_ids, expected[:, enc["input_ids"].shape[1]:][:, : ro.completion_ids.shape[1]])
    with torch.no_grad():
        lp, _ = sequence_logprobs(peaked_lm, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    # the training forward agrees with the sampler
    assert_logprobs_within_fp32(peaked_lm, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                {"sampler": ro.logprobs, "training forward": lp})
