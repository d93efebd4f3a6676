"""The chunked log-softmax of `token_logprobs`: the values and gradients of one log-softmax over the whole
batch, bit for bit, without keeping a second (N, T, V) tensor for the backward."""

from __future__ import annotations

import pytest
import torch

from feedbackrl.models.logprobs import token_logprobs

N, T, V = 20, 5, 64


def _reference(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[..., None]).squeeze(-1)


@pytest.mark.parametrize("chunk_rows", [1, 3, 8, 64])
def test_chunked_values_and_gradients_equal_one_log_softmax(chunk_rows: int):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(N, T, V, generator=gen) * 4
    ids = torch.randint(0, V, (N, T), generator=gen)
    upstream = torch.randn(N, T, generator=gen)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    lp, ent = token_logprobs(a, ids, torch.ones(N, T), 0.7, with_entropy=True, chunk_rows=chunk_rows)
    ref = _reference(b, ids, 0.7)
    assert torch.equal(lp, ref)
    (lp * upstream).sum().backward()
    (ref * upstream).sum().backward()
    assert torch.equal(a.grad, b.grad)
    p = torch.softmax(logits / 0.7, -1)
    torch.testing.assert_close(ent, -(p * p.log()).sum(-1), rtol=1e-5, atol=1e-6)
    assert not ent.requires_grad


def test_the_backward_keeps_no_second_full_size_tensor():
    logits = torch.randn(N, T, V, requires_grad=True)
    ids = torch.randint(0, V, (N, T))
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() != logits.data_ptr():  # the logits themselves are the caller's
            saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(logits, ids, torch.ones(N, T), 1.0, chunk_rows=4)
    assert max(saved) < N * T * V / 4, f"a saved tensor of {max(saved)} elements (full size {N * T * V})"
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _reference(logits, ids, 1.0)
    assert max(saved) == N * T * V  # what the unchunked log-softmax keeps (its output)
