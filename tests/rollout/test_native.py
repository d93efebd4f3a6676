"""The C decode-attention kernel (`rollout/native.py`, `decode_attention.c`) against the PyTorch ops it replaces.

One decode step: RoPE on q and k (pair-adjacent columns, a complex multiply), the new key and value
written to the cache, softmax attention over the row's visible keys, output (N, H * D). The reference
is the decoder's PyTorch path, op for op.
"""

import logging
import os
import platform
import shutil

import pytest
import torch
import torch.nn.functional as F
from fp32 import U, assert_logprobs_within_fp32, assert_within, gamma

from feedbackrl.rollout import generate as gen_mod
from feedbackrl.rollout import native
from feedbackrl.rollout.generate import generate

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                              reason="no C compiler on this machine: the decoder keeps its PyTorch path")


def reference(qkv, rot, k, v, at, keep, heads, scale):
    """The decoder's PyTorch path for one token per row; mutates qkv, k and v like the kernel."""
    n, hk, _, d = k.shape
    torch.view_as_complex(qkv[:, : (heads + hk) * d].view(n, heads + hk, d // 2, 2)).mul_(rot.view(n, 1, d // 2))
    new_kv = qkv[:, heads * d :].view(n, 2, hk, d)
    k[:, :, at], v[:, :, at] = new_kv[:, 0], new_kv[:, 1]
    q = qkv[:, : heads * d].view(n, 1, heads, d).transpose(1, 2)
    mask = {} if keep is None else {"attn_mask": keep[:, None, None, : at + 1]}
    gqa = {"enable_gqa": True} if hk != heads else {}
    att = F.scaled_dot_product_attention(q, k[:, :, : at + 1], v[:, :, : at + 1], scale=scale, **mask, **gqa)
    return att.transpose(1, 2).reshape(n, heads * d)


def float64_truth_and_bounds(qkv, rot, k, v, at, keep, heads, scale):
    """The reference in float64 from the same float32 inputs, and elementwise bounds on a float32 run's error.

    Returns (out, qkv, k) of the float64 run and the bounds (out_tol, rope_tol) that any float32 implementation
    of these ops stays within, whatever its summation order, vector width or FMA use (see tests/fp32.py):
    - RoPE, x' = a c - b s: gamma(2) (|a||c| + |b||s|) per element (R below, the rotation on magnitudes).
    - score s_j = scale * q'.k'_j over D terms, with q' and k' rotated in float32 first: error at most
      E_j = scale gamma(D + 3) sum_d R(q)_d R(k_j)_d, plus 2 U (|s_j| + |s_j - m|) for the product by the
      scale and the subtraction of the running max m.
    - softmax: a score error e_j moves p_j by a relative e_j - sum_l p_l e_l, at most 2 max_j E_j; exp adds
      4 U (the kernel's Cephes polynomial is ~1e-7 relative, PyTorch's Sleef exp 1 ulp), the normalising
      sum gamma(len) and the division U.
    - output sum_j p_j v_j: gamma(len) sum_j p_j |v_j| for the sum, 2 U for the final scaling.
    Together, first order in U: |out - exact| <= (2 max_j E_j + 2 gamma(len) + 8 U) sum_j p_j |v_j|.
    """
    n, hk, t, d = k.shape
    want_qkv, want_k, want_v = qkv.double(), k.double(), v.double()
    want = reference(want_qkv, rot.to(torch.complex128), want_k, want_v, at, keep, heads, scale)
    pairs = qkv.double()[:, : (heads + hk) * d].view(n, heads + hk, d // 2, 2).abs()
    c, s = rot.real.double().abs()[:, None], rot.imag.double().abs()[:, None]
    mag = torch.stack([pairs[..., 0] * c + pairs[..., 1] * s, pairs[..., 0] * s + pairs[..., 1] * c], -1)
    mag = mag.view(n, heads + hk, d)  # R(x): each rotated element's terms in magnitude
    rope_tol = torch.zeros_like(want_qkv)
    rope_tol[:, : (heads + hk) * d] = gamma(2) * mag.view(n, -1)
    k_mag = want_k.abs()[:, :, : at + 1].clone()
    k_mag[:, :, at] = mag[:, heads:]
    k_mag = k_mag.repeat_interleave(heads // hk, dim=1)  # (n, heads, len, d): each query head's keys
    q_rot = want_qkv[:, : heads * d].view(n, heads, 1, d)
    scores = scale * (q_rot * want_k[:, :, : at + 1].repeat_interleave(heads // hk, dim=1)).sum(-1)
    visible = torch.ones(n, 1, at + 1, dtype=torch.bool) if keep is None else keep[:, None, : at + 1]
    scores = scores.masked_fill(~visible, -torch.inf)
    top = scores.amax(-1, keepdim=True)
    err = scale * gamma(d + 3) * (mag[:, :heads, None] * k_mag).sum(-1) + 2 * U * (scores.abs() + (scores - top).abs())
    max_err = err.masked_fill(~visible, 0).amax(-1, keepdim=True)  # (n, heads, 1)
    p = scores.softmax(-1)
    v_mag = want_v[:, :, : at + 1].abs().repeat_interleave(heads // hk, dim=1)
    weighted_v = (p[:, :, None] @ v_mag)[:, :, 0]  # sum_j p_j |v_j|, (n, heads, d)
    out_tol = (2 * max_err + 2 * gamma(at + 1) + 8 * U) * weighted_v
    return (want, want_qkv, want_k), (out_tol.reshape(n, heads * d), rope_tol)


def inputs(n, heads, kv_heads, d, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g) * 2
    rot = torch.polar(torch.ones(n, d // 2), torch.rand(n, d // 2, generator=g) * 6.3)
    k, v = torch.randn(2, n, kv_heads, t, d, generator=g).unbind(0)
    return qkv, rot, k.contiguous(), v.contiguous()


@needs_cc
@pytest.mark.parametrize(("n", "heads", "kv_heads", "d"),
                         [(64, 4, 4, 32), (5, 8, 8, 64), (3, 4, 2, 16), (2, 2, 1, 128), (3, 3, 3, 24)])
@pytest.mark.parametrize("at", [0, 6, 39])
@pytest.mark.parametrize("masked", [False, True])
def test_kernel_matches_the_pytorch_ops_it_replaces(n, heads, kv_heads, d, at, masked):
    t = 40
    qkv, rot, k, v = inputs(n, heads, kv_heads, d, t)
    keep = None
    if masked:  # left padding of different lengths; the new position is always visible
        keep = torch.arange(t)[None, :] >= torch.arange(n)[:, None] % 4
        keep[:, at] = True
    (exact, exact_qkv, exact_k), (out_tol, rope_tol) = float64_truth_and_bounds(qkv, rot, k, v, at, keep, heads,
                                                                                d**-0.5)
    want_qkv, want_k, want_v = qkv.clone(), k.clone(), v.clone()
    want = reference(want_qkv, rot, want_k, want_v, at, keep, heads, d**-0.5)
    out = torch.full((n, heads * d), float("nan"))
    native.decode_attention(qkv, rot, k, v, at, keep, out, heads, d**-0.5)
    # both float32 sides, the kernel and PyTorch, within the rounding bound of the float64 run (no CPU's figure)
    for name, got, got_qkv, got_k in [("kernel", out, qkv, k), ("pytorch", want, want_qkv, want_k)]:
        assert_within(got, exact, out_tol, f"{name} attention output")
        assert_within(got_qkv, exact_qkv, rope_tol, f"{name} q and k rotated in place")  # v's columns: bound 0
        cache_tol = torch.zeros_like(exact_k)
        cache_tol[:, :, at] = rope_tol[:, heads * d : (heads + kv_heads) * d].view(n, kv_heads, d)
        assert_within(got_k, exact_k, cache_tol, f"{name} key cache")  # the new key and nothing else written
    assert torch.equal(v, want_v)
    assert out_tol.max() < 1e-3 * exact.abs().max()  # the bound stays far below any real fault (a wrong mask, head)


@needs_cc
def test_masked_keys_get_no_weight_even_when_their_scores_are_huge():
    n, heads, d, t, at = 2, 1, 16, 8, 5
    qkv, rot, k, v = inputs(n, heads, heads, d, t, seed=1)
    rot = torch.ones_like(rot)  # no rotation: q as given
    qkv[:, :d] = 1.0
    k[:, :, :2] = 100.0  # keys 0 and 1 would take all the weight if they were visible
    v[:, :, :2] = 1e6
    keep = torch.ones(n, t, dtype=torch.bool)
    keep[:, :2] = False
    out = torch.empty(n, heads * d)
    (exact, _, _), (out_tol, _) = float64_truth_and_bounds(qkv, rot, k, v, at, keep, heads, d**-0.5)
    native.decode_attention(qkv, rot, k, v, at, keep, out, heads, d**-0.5)
    assert out.abs().max() < 10  # a visible key's value, never the 1e6 of a masked one
    assert_within(out, exact, out_tol, "kernel attention output")


@needs_cc
def test_kernel_rejects_bad_inputs_with_a_clear_message():
    qkv, rot, k, v = inputs(2, 2, 2, 16, 8)
    out = torch.empty(2, 32)
    with pytest.raises(ValueError, match="position 8 outside a cache of 8"):
        native.decode_attention(qkv, rot, k, v, 8, None, out, 2, 0.25)
    with pytest.raises(TypeError, match="float32"):
        native.decode_attention(qkv.double(), rot, k, v, 0, None, out, 2, 0.25)
    with pytest.raises(ValueError, match="contiguous"):
        native.decode_attention(qkv, rot, k.transpose(2, 3).contiguous().transpose(2, 3), v, 0, None, out, 2, 0.25)
    with pytest.raises(ValueError, match="do not match the cache"):
        native.decode_attention(qkv, rot, k, v, 0, None, out, 4, 0.25)
    with pytest.raises(ValueError, match="keep"):
        native.decode_attention(qkv, rot, k, v, 0, torch.ones(2, 7, dtype=torch.bool), out, 2, 0.25)
    with pytest.raises(ValueError, match="CPU tensors only"):
        native.decode_attention(qkv, rot, k.to("meta"), v, 0, None, out, 2, 0.25)
    with pytest.raises(ValueError, match="distinct rows"):  # every row the same memory: threads would race
        native.decode_attention(qkv[:1].expand(2, -1), rot, k, v, 0, None, out, 2, 0.25)
    odd = inputs(2, 2, 2, 16, 8)
    with pytest.raises(ValueError, match="must be even"):
        native.decode_attention(odd[0][:, :30], odd[1][:, :7].contiguous(), odd[2][..., :15].contiguous(),
                                odd[3][..., :15].contiguous(), 0, None, torch.empty(2, 30), 2, 0.25)


@needs_cc
def test_the_per_decoder_call_refuses_mismatched_caches_and_moved_buffers():
    qkv, rot, k, v = inputs(2, 2, 2, 16, 8)
    out = torch.empty(2, 32)
    with pytest.raises(ValueError, match="layer caches differ"):
        native.DecodeAttention(qkv, rot, [(k, v), (k[:, :, :4].contiguous(), v[:, :, :4].contiguous())], None, out,
                               2, 0.25)
    call = native.DecodeAttention(qkv, rot, [(k, v)], None, out, 2, 0.25)
    call(0, 3)
    qkv.resize_(4, 96)  # a buffer reallocated (as an out= of another shape would): its old pointer is stale
    with pytest.raises(RuntimeError, match="a buffer moved"):
        call(0, 4)


@needs_cc
def test_kernel_on_two_threads_matches_one():
    qkv, rot, k, v = inputs(64, 4, 2, 32, 30, seed=3)
    outs = []
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            q, kk, vv, out = qkv.clone(), k.clone(), v.clone(), torch.empty(64, 128)
            native.decode_attention(q, rot, kk, vv, 20, None, out, 4, 0.2)
            outs.append((out, q, kk, vv))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)  # rows are independent: the same arithmetic whichever thread runs them


def test_a_decoder_refuses_a_step_with_another_row_count(peaked_lm, tokenizer):
    if not native.available():
        pytest.skip("no kernel: the PyTorch path raises its own shape error")
    decoder = gen_mod._LlamaDecoder(peaked_lm, torch.ones(2, 3, dtype=torch.long), 4)
    with torch.no_grad():  # as in generate
        decoder.prefill(torch.tensor([[5, 6, 7], [8, 9, 10]]), torch.arange(3).repeat(2, 1))
        with pytest.raises(ValueError, match="built for 2 rows, stepped with 3"):
            decoder(torch.tensor([[5], [6], [7]]), torch.full((3, 1), 3))


@needs_cc
@pytest.mark.parametrize("model_name", ["peaked_lm", "peaked_qwen"])
def test_generate_with_and_without_the_kernel_agree(model_name, tokenizer, request, monkeypatch):
    """Padded prompts (a mask), a prompt repeated (shared prefill); GQA and biases on the Qwen model."""
    model = request.getfixturevalue(model_name)
    prompts = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello, world!"] * 3
    assert native.available()
    calls = []
    real_call = native.DecodeAttention.__call__
    monkeypatch.setattr(native.DecodeAttention, "__call__", lambda self, *a: calls.append(a) or real_call(self, *a))
    with_kernel = generate(model, tokenizer, prompts, 12, temperature=0.9, generator=torch.Generator().manual_seed(5))
    layers = model.config.num_hidden_layers
    assert len(calls) == layers * (with_kernel.completion_ids.shape[1] - 1)  # every layer of every decode step
    monkeypatch.setattr(native, "available", lambda: False)
    without = generate(model, tokenizer, prompts, 12, temperature=0.9, generator=torch.Generator().manual_seed(5))
    assert torch.equal(with_kernel.completion_ids, without.completion_ids)
    assert_logprobs_within_fp32(model, with_kernel.prompt_ids, with_kernel.prompt_mask, with_kernel.completion_ids,
                                with_kernel.completion_mask, {"kernel": with_kernel.logprobs,
                                                              "pytorch": without.logprobs}, temperature=0.9)


@pytest.fixture
def fresh_kernel(tmp_path, monkeypatch):
    """`native._kernel` rebuilt from scratch in an empty cache directory; restored afterwards."""
    monkeypatch.setenv("FEEDBACKRL_CACHE", str(tmp_path))
    native._kernel.cache_clear()
    yield tmp_path
    native._kernel.cache_clear()


def test_disabled_by_environment(fresh_kernel, monkeypatch, peaked_lm):
    monkeypatch.setenv("FEEDBACKRL_NATIVE", "0")
    assert not native.available()
    with pytest.raises(RuntimeError, match="not available"):
        native.decode_attention(*inputs(1, 1, 1, 16, 4), 0, None, torch.empty(1, 16), 1, 0.25)
    assert gen_mod._LlamaDecoder(peaked_lm, torch.ones(2, 3, dtype=torch.long), 4).native is None


def test_a_compiler_that_fails_means_the_pytorch_path_and_a_warning(fresh_kernel, monkeypatch, caplog):
    monkeypatch.setenv("CC", "false")  # runs, exits 1: a broken toolchain
    with caplog.at_level(logging.WARNING, logger="feedbackrl.rollout.native"):
        assert not native.available()
    assert "decode-attention kernel unavailable" in caplog.text
    assert not list(fresh_kernel.rglob("*.so"))


@needs_cc
def test_built_once_into_the_cache_directory(fresh_kernel):
    assert native.available()
    (lib,) = fresh_kernel.rglob("*.so")
    mtime = lib.stat().st_mtime_ns
    native._kernel.cache_clear()
    assert native.available()
    assert lib.stat().st_mtime_ns == mtime  # loaded from the cache, not rebuilt


@needs_cc
def test_decoder_uses_the_kernel_when_available(peaked_lm):
    decoder = gen_mod._LlamaDecoder(peaked_lm, torch.ones(2, 3, dtype=torch.long), 4)
    assert isinstance(decoder.native, native.DecodeAttention)


def test_march_can_be_narrowed_and_keys_its_own_build(monkeypatch, tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("FEEDBACKRL_CACHE", str(tmp_path))
    monkeypatch.delenv("FEEDBACKRL_NATIVE_MARCH", raising=False)
    assert native._flags()[0] == "-march=native"
    default = native._build(cc)
    monkeypatch.setenv("FEEDBACKRL_NATIVE_MARCH", "x86-64-v3" if platform.machine() == "x86_64" else "armv8-a")
    narrowed = native._build(cc)
    assert native._flags()[0].startswith("-march=") and native._flags()[0] != "-march=native"
    assert narrowed != default and narrowed.exists() and default.exists()
