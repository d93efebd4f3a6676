import copy

import torch

from feedbackrl.train.optim import adamw


def test_fused_adamw_matches_the_reference_update():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(257))
    b = torch.nn.Parameter(a.detach().clone())
    fused = adamw([a], lr=1e-2, weight_decay=0.1)
    reference = torch.optim.AdamW([b], lr=1e-2, weight_decay=0.1, foreach=False, fused=False)
    assert fused.param_groups[0]["fused"] is True
    for _ in range(20):
        g = torch.randn(257)
        a.grad, b.grad = g.clone(), g.clone()
        fused.step()
        reference.step()
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
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
