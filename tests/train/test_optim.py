import copy

import torch
from fp32 import assert_within, gamma

from feedbackrl.train.optim import adamw


def adamw_float32_bound(p0: torch.Tensor, grads: list[torch.Tensor], lr: float, weight_decay: float,
                        betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.Tensor:
    """Elementwise bound on a float32 AdamW run's parameters after len(grads) steps, from float64 magnitudes.

    Per element and step k of K: the moments are K-term sums (m_k = b1 m_{k-1} + (1 - b1) g_k and
    v_k = b2 v_{k-1} + (1 - b2) g_k^2, at most four roundings a step), so m_k is within gamma(4K) M_k of its
    exact value, M_k the same recursion over |g_k|, and v_k (terms >= 0) within gamma(4K) v_k. The update
    u_k = lr / bc1 * m_k / (sqrt(v_k / bc2) + eps) adds a square root, two divisions and a sum: at most
    gamma(4K + 6) (lr / bc1) (M_k + |m_k|) / d_k <= 2 gamma(4K + 6) A_k, A_k = lr / bc1 M_k / d_k. The parameter
    step p_k = p_{k-1} (1 - lr wd) - u_k rounds three times, gamma(3) (|p_{k-1}| + A_k), and errors carried from
    earlier steps shrink by (1 - lr wd) < 1 (the gradients are given: no error feeds back). Summed over the K
    steps, in any order of the elementwise operations and with or without FMA.
    """
    (b1, b2), k_steps = betas, len(grads)
    p = p0.double().clone()
    m, v, big_m = torch.zeros_like(p), torch.zeros_like(p), torch.zeros_like(p)
    bound = torch.zeros_like(p)
    for k, g in enumerate(grads, start=1):
        g = g.double()
        m, v, big_m = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g, b1 * big_m + (1 - b1) * g.abs()
        d = (v / (1 - b2**k)).sqrt() + eps
        a = lr / (1 - b1**k) * big_m / d
        bound += gamma(3) * (p.abs() + a) + 2 * gamma(4 * k_steps + 6) * a
        p = p * (1 - lr * weight_decay) - lr / (1 - b1**k) * m / d
    return bound


def test_fused_adamw_matches_the_reference_update():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(257))
    b = torch.nn.Parameter(a.detach().clone())
    exact = torch.nn.Parameter(a.detach().double())
    fused = adamw([a], lr=1e-2, weight_decay=0.1)
    reference = torch.optim.AdamW([b], lr=1e-2, weight_decay=0.1, foreach=False, fused=False)
    reference64 = torch.optim.AdamW([exact], lr=1e-2, weight_decay=0.1, foreach=False, fused=False)
    assert fused.param_groups[0]["fused"] is True
    p0, grads = a.detach().clone(), []
    for _ in range(20):
        g = torch.randn(257)
        grads.append(g)
        a.grad, b.grad, exact.grad = g.clone(), g.clone(), g.double()
        fused.step()
        reference.step()
        reference64.step()
    # the fused kernel and the reference loop order their elementwise float32 operations differently: each
    # within the float32 bound of the same update rule run in float64 (tests/fp32.py), on any CPU
    bound = adamw_float32_bound(p0, grads, lr=1e-2, weight_decay=0.1)
    assert bound.max() < 1e-2 * 1e-2  # a hundredth of one step's update (lr): a wrong update rule shows
    assert_within(a.detach(), exact.detach(), bound, "fused AdamW")
    assert_within(b.detach(), exact.detach(), bound, "reference AdamW")
    assert not torch.equal(a.detach(), torch.zeros(257))


def test_fused_adamw_state_round_trips():
    p = torch.nn.Parameter(torch.ones(4))
    opt = adamw([p], lr=0.1)
    p.grad = torch.ones(4)
    opt.step()
    q = torch.nn.Parameter(p.detach().clone())
    again = adamw([q], lr=0.1)
    again.load_state_dict(copy.deepcopy(opt.state_dict()))  # as from disk: no shared tensors
    p.grad, q.grad = torch.full((4,), 0.5), torch.full((4,), 0.5)
    opt.step()
    again.step()
    assert torch.equal(p, q)


def test_state_is_allocated_up_front_and_updates_match_lazy_fused_adamw():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(3, 5))
    b = torch.nn.Parameter(a.detach().clone())
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    eager = adamw([a, frozen], lr=1e-2, weight_decay=0.1)
    lazy = torch.optim.AdamW([b], lr=1e-2, weight_decay=0.1, fused=True)
    assert set(eager.state[a]) == {"step", "exp_avg", "exp_avg_sq"} and frozen not in eager.state
    assert len(lazy.state) == 0
    for _ in range(5):
        g = torch.randn(3, 5)
        a.grad, b.grad = g.clone(), g.clone()
        eager.step()
        lazy.step()
    assert torch.equal(a, b)
    for k, v in lazy.state[b].items():
        assert torch.equal(eager.state[a][k], v) and eager.state[a][k].dtype == v.dtype, k
