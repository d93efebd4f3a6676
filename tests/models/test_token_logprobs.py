"""The fused log-softmax of `token_logprobs`: the values and gradients of `log_softmax(...).gather(...)` within
float32 rounding of a float64 run, in blocks of any size, without keeping a second (N, T, V) tensor."""

from __future__ import annotations

import pytest
import torch
from fp32 import U, assert_within, probabilistic_gamma

from feedbackrl.models.logprobs import token_logprobs

N, T, V = 20, 5, 64


def _reference(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[..., None]).squeeze(-1)


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(N, T, V, generator=gen) * 4, torch.randint(0, V, (N, T), generator=gen), \
        torch.randn(N, T, generator=gen)


def _check_against_float64(logits: torch.Tensor, ids: torch.Tensor, upstream: torch.Tensor, temperature: float,
                           block_rows: int) -> None:
    a = logits.clone().requires_grad_()
    mask = torch.ones(ids.shape)
    mask[0, -2:] = 0  # a padded row: log-prob and entropy exactly 0 there, no gradient
    lp, ent = token_logprobs(a, ids, mask, temperature, with_entropy=True, block_rows=block_rows)
    (lp * upstream).sum().backward()
    z = logits.double().requires_grad_()
    want = _reference(z, ids, temperature) * mask
    (want * upstream).sum().backward()
    p = torch.softmax(z.detach() / temperature, -1)
    want_ent = -(p * p.log()).sum(-1) * mask
    # a log-prob is a logit minus a V-term logsumexp: float32 error within twice the sum's bound on |z| / T
    tol = 2 * probabilistic_gamma(V) * (logits.abs().amax(-1) / temperature) + 4 * U
    assert_within(lp, want.detach(), tol * mask, "log-prob")
    assert_within(ent, want_ent, (2 * tol + probabilistic_gamma(V) * want_ent.abs()) * mask, "entropy")
    # d/dz = g (onehot - p) / T: each p = exp(z - lse) carries the log-prob's error relatively
    g = (upstream * mask).abs()[..., None] / temperature
    assert_within(a.grad, z.grad, g * (p * 2 * tol[..., None] + 4 * U), "gradient")
    assert torch.equal(lp[0, -2:], torch.zeros(2)) and torch.equal(a.grad[0, -2:], torch.zeros(2, V))
    assert not ent.requires_grad


@pytest.mark.parametrize("block_rows", [1, 3, 8, 64, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_within_fp32_of_one_log_softmax(block_rows: int, temperature: float):
    _check_against_float64(*_inputs(), temperature, block_rows)


def test_a_slice_of_larger_logits_as_hf_gives_them():
    """HF's logits[:, -T-1:-1]: not contiguous; the blocks read it in place, with the same result."""
    logits, ids, upstream = _inputs(1)
    full = torch.cat([logits, torch.randn(N, 1, V)], 1)
    sliced = full[:, :-1]
    assert not sliced.is_contiguous()
    _check_against_float64(sliced, ids, upstream, 1.3, 3)
    lp_slice, _ = token_logprobs(sliced, ids, torch.ones(N, T), 1.3, block_rows=3)
    lp_contig, _ = token_logprobs(sliced.contiguous(), ids, torch.ones(N, T), 1.3, block_rows=3)
    assert torch.equal(lp_slice, lp_contig)


def test_bf16_logits_get_a_bf16_gradient_and_float32_log_probs():
    logits, ids, upstream = _inputs(2)
    a = logits.bfloat16().requires_grad_()
    lp, _ = token_logprobs(a, ids, torch.ones(N, T), 1.0)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, _reference(a.detach().float(), ids, 1.0), rtol=1e-5, atol=1e-5)
    (lp * upstream).sum().backward()
    assert a.grad.dtype == torch.bfloat16


def test_float64_logits_keep_float64_precision_in_values_and_gradients():
    """A float64 model (as the sampler-parity tests run one) gets float64 log-probs, not float32 ones."""
    logits, ids, upstream = _inputs(3)
    a = logits.double().requires_grad_()
    lp, ent = token_logprobs(a, ids, torch.ones(N, T), 0.7, with_entropy=True, block_rows=3)
    assert lp.dtype == ent.dtype == torch.float64
    (lp * upstream.double()).sum().backward()
    z = logits.double().requires_grad_()
    (_reference(z, ids, 0.7) * upstream.double()).sum().backward()
    # float64 rounding (~1e-16 relative) on |z| / T <= ~25: far below 1e-12; float32 would give ~1e-6
    torch.testing.assert_close(lp, _reference(logits.double(), ids, 0.7), rtol=0, atol=1e-12)
    torch.testing.assert_close(a.grad, z.grad, rtol=0, atol=1e-12)


def test_the_backward_keeps_no_second_full_size_tensor():
    logits = torch.randn(N, T, V, requires_grad=True)
    ids = torch.randint(0, V, (N, T))
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() != logits.data_ptr():  # the logits themselves are the caller's
            saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(logits, ids, torch.ones(N, T), 1.0, with_entropy=True, block_rows=4)
    assert max(saved) <= N * T, f"a saved tensor of {max(saved)} elements (full size {N * T * V})"
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _reference(logits, ids, 1.0)
    assert max(saved) == N * T * V  # what the unfused log-softmax keeps (its output)
