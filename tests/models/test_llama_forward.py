"""The fast training forward (`llama_forward.completion_logits`) against the model's own HF forward.

`sequence_logprobs` takes the fast path for eligible Llama-family models; both paths must give the
same log-probs, entropies and parameter gradients up to float32 rounding, with left-padded prompts,
padded completions and a temperature != 1, on a tied-embedding Llama, a GQA Qwen2 with q/k/v
biases and a GQA Llama with biases everywhere (o_proj and MLP too).
"""

import copy

import pytest
import torch
from fp32 import assert_logprobs_within_fp32
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from feedbackrl.models import logprobs as lp_mod
from feedbackrl.models.llama_forward import shared_prompts
from feedbackrl.models.logprobs import encode_prompts, sequence_logprobs, train_fast_path_ok

PROMPTS = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello, world!", "a"]  # different lengths: left padding


def _peaked(model: torch.nn.Module) -> torch.nn.Module:
    """Redraw weights and biases with std 0.3 (and norm weights around 1) so that logits depend on the input."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def qwen_gqa(tokenizer):
    """Qwen2 with grouped-query attention (4 query heads, 2 KV heads), q/k/v biases, untied LM head."""
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128,
                      pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    return _peaked(Qwen2ForCausalLM(cfg))


@pytest.fixture(scope="module")
def llama_biases(tokenizer):
    """Llama with GQA, biases on every projection (attention_bias, mlp_bias) and llama3 RoPE scaling."""
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=1, intermediate_size=80, max_position_embeddings=128,
                      attention_bias=True, mlp_bias=True, pad_token_id=tokenizer.pad_token_id,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 16})
    return _peaked(LlamaForCausalLM(cfg))


def _batch(tokenizer, prompts: list[str], t: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Left-padded prompts and random completions of T tokens, right-padded on every other row."""
    gen = torch.Generator().manual_seed(seed)
    p_ids, p_mask = encode_prompts(tokenizer, prompts)
    n = len(prompts)
    c_ids = torch.randint(4, len(tokenizer), (n, t), generator=gen)
    lengths = torch.where(torch.arange(n) % 2 == 0, t, torch.randint(1, t, (n,), generator=gen))
    c_mask = (torch.arange(t)[None] < lengths[:, None]).long()
    c_ids = c_ids.masked_fill(c_mask == 0, tokenizer.pad_token_id)
    return p_ids, p_mask, c_ids, c_mask


def _run(model, batch, fast: bool, monkeypatch: pytest.MonkeyPatch, temperature: float = 0.7):
    """Log-probs, entropy and every parameter's gradient of a loss weighting each token differently."""
    monkeypatch.setattr(lp_mod, "train_fast_path_ok", train_fast_path_ok if fast else (lambda model: False))
    model.zero_grad(set_to_none=True)
    logprobs, entropy = sequence_logprobs(model, *batch, temperature=temperature, with_entropy=True)
    weights = torch.linspace(-1.0, 2.0, logprobs.numel()).view_as(logprobs)
    (logprobs * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logprobs.detach(), entropy, grads


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def _assert_same(fast, slow, exact) -> None:
    """fast and slow (HF) agree within 1e-5 relative to each tensor's scale (log-probs, entropy) or 1e-4
    (gradients), and the fast path is as close as HF's own float32 forward to a float64 run of it.

    The test models have std-0.3 weights, so logits reach +-25 and HF's float32 gradients are ~5e-5 (relative to
    their largest entry) away from float64: that, not the fast path, sets the gradient tolerance. The comparison
    with HF's own error has a floor of 1e-5: some gradients nearly cancel (a k-projection bias shifts every key
    alike, which softmax barely sees), and there HF's error is sometimes small by luck (1.5e-6, where both fast
    paths, with and without shared prompts, are at 6-7e-6; all of them are within 2e-15 of each other in float64).
    """
    parts = [("logprobs", fast[0], slow[0], exact[0], 1e-5), ("entropy", fast[1], slow[1], exact[1], 1e-5)]
    assert fast[2].keys() == slow[2].keys()
    parts += [(name, fast[2][name], want, exact[2][name], 1e-4) for name, want in slow[2].items()]
    for name, got, want, truth, tol in parts:
        scale = want.abs().max().item()
        assert scale > 0, f"{name}: all zero, the test would be vacuous"
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale, msg=lambda m, n=name: f"{n}: {m}")
        err_fast, err_hf = _rel_err(got, truth), _rel_err(want, truth)
        assert err_fast <= 4 * err_hf + 1e-5, f"{name}: fast path {err_fast:.2e} from float64, HF {err_hf:.2e}"


def _compare(model, batch, monkeypatch: pytest.MonkeyPatch, temperature: float = 0.7) -> None:
    fast = _run(model, batch, True, monkeypatch, temperature)
    slow = _run(model, batch, False, monkeypatch, temperature)
    exact = _run(copy.deepcopy(model).double(), batch, False, monkeypatch, temperature)
    _assert_same(fast, slow, exact)


# shared: every prompt twice, not side by side (as DPO pairs or GRPO groups, but in any order);
# partly: two prompts three times each at scattered rows, the other four once; distinct: none repeated
SHARING = {"shared": PROMPTS * 2, "partly": PROMPTS + PROMPTS[1:3] + PROMPTS[2:0:-1],
           "distinct": PROMPTS + [p + "0" for p in PROMPTS]}


@pytest.mark.parametrize("sharing", list(SHARING))
@pytest.mark.parametrize("model_name", ["peaked_lm", "qwen_gqa", "llama_biases"])
def test_fast_forward_matches_hf_logprobs_entropy_and_gradients(model_name, sharing, tokenizer, request, monkeypatch):
    model = request.getfixturevalue(model_name).train()
    assert train_fast_path_ok(model)
    batch = _batch(tokenizer, SHARING[sharing], 9)
    assert (batch[1] == 0).any() and (batch[3] == 0).any(), "need left-padded prompts and padded completions"
    ids, mask = torch.cat([batch[0], batch[2]], 1), torch.cat([batch[1], torch.ones_like(batch[3])], 1)
    found = shared_prompts(ids, mask, batch[0].shape[1])
    assert (found is None) if sharing == "distinct" else len(found[0]) == len(PROMPTS)
    _compare(model, batch, monkeypatch)


@pytest.mark.parametrize("model_name", ["peaked_lm", "qwen_gqa"])
def test_a_sampled_pad_token_trains_no_embedding_row_as_in_hf(model_name, tokenizer, request, monkeypatch):
    """HF embeddings with a padding_idx never send a gradient to that row, even where the token is real
    (a policy can sample the pad id); the pad row is also the tied LM head's, so only the input side differs."""
    model = request.getfixturevalue(model_name).train()
    pad = tokenizer.pad_token_id
    assert model.get_input_embeddings().padding_idx == pad
    batch = _batch(tokenizer, SHARING["shared"], 9, seed=2)
    batch[2][:, 1:6:2] = pad  # real completion tokens equal to the pad id (inside the mask)
    batch[3][:, :6] = 1
    _compare(model, batch, monkeypatch)


def test_unpadded_prompts_take_the_maskless_branch_and_agree(peaked_lm, tokenizer, monkeypatch):
    batch = _batch(tokenizer, ["12+34=", "56+78=", "90+12="] * 3, 6, seed=1)
    assert (batch[1] == 1).all()
    _compare(peaked_lm.train(), batch, monkeypatch, 1.0)


def test_repeated_prompts_with_empty_completions(peaked_lm, tokenizer):
    p_ids, p_mask = encode_prompts(tokenizer, ["1+1=", "1+1=", "2+3="])
    empty = torch.zeros(3, 0, dtype=torch.long)
    assert sequence_logprobs(peaked_lm, p_ids, p_mask, empty, empty)[0].shape == (3, 0)


def test_fast_forward_without_grad_matches(qwen_gqa, tokenizer):
    # old/ref log-probs are computed under no_grad: the custom backward functions must not be needed
    batch = _batch(tokenizer, PROMPTS, 5)
    with torch.no_grad():
        lp, _ = sequence_logprobs(qwen_gqa, *batch, temperature=1.3)
        assert lp_mod.train_fast_path_ok(qwen_gqa)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lp_mod, "train_fast_path_ok", lambda model: False)
            want, _ = sequence_logprobs(qwen_gqa, *batch, temperature=1.3)
    # both float32 paths within float32 rounding of a float64 run of the model (tests/fp32.py)
    assert_logprobs_within_fp32(qwen_gqa, *batch, {"fast": lp, "hf": want}, temperature=1.3)


def test_dropout_checkpointing_and_hooks_take_the_hf_forward(tokenizer):
    from feedbackrl.models.tiny import build_model

    model = build_model(tokenizer, "tiny", seed=0).train()
    assert train_fast_path_ok(model)
    model.config.attention_dropout = 0.1
    assert not train_fast_path_ok(model), "dropout while training: the fast path has none"
    assert train_fast_path_ok(model.eval()), "dropout is off in eval mode"
    model.config.attention_dropout = 0.0
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *a: None)
    assert not train_fast_path_ok(model.train()), "a hook (e.g. an adapter) changes the maths"
    handle.remove()
    assert train_fast_path_ok(model)
    # transformers 5.2x renamed gradient_checkpointing_enable (older 5.x have only that name)
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    assert not train_fast_path_ok(model), "checkpointing trades time for memory on purpose"


@pytest.mark.parametrize("sharing", ["shared", "distinct"])
def test_one_token_completions_run_the_prompts_only_and_agree(sharing, peaked_lm, tokenizer, monkeypatch):
    """The trunk runs every position but the last: with T = 1 that is the prompt alone (no completion segment)."""
    p_ids, p_mask = encode_prompts(tokenizer, SHARING[sharing])
    c_ids = torch.randint(4, len(tokenizer), (len(p_ids), 1), generator=torch.Generator().manual_seed(3))
    _compare(peaked_lm.train(), (p_ids, p_mask, c_ids, torch.ones_like(c_ids)), monkeypatch)
