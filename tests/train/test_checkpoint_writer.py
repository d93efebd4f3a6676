"""The checkpoint writer both on-policy loops share, on a plain torch module: what it writes, what `restore` puts
back, and the refusals. The loops' own bit-exact resumes: test_checkpoint_resume.py, tests/control."""

import random

import pytest
import torch
from torch import nn

from feedbackrl.train.checkpoint import (
    CONFIG_FILE,
    MODEL_CONFIG,
    MODULE_FILE,
    STATE_FILE,
    CheckpointError,
    ModuleFiles,
    is_checkpoint,
    latest_checkpoint,
    load_extra,
    restore,
    save_checkpoint,
)


def _stepped() -> tuple[nn.Linear, torch.optim.Adam]:
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.ones(4, 3)).sum().backward()
    opt.step()
    return net, opt


def test_a_module_checkpoint_round_trips_every_stream_and_state(tmp_path):
    net, opt = _stepped()
    prompt_rng, gen = random.Random(1), torch.Generator().manual_seed(2)
    for _ in range(3):  # move every stream off its seed
        prompt_rng.random(), torch.rand(1, generator=gen), torch.rand(1)
    ckpt = save_checkpoint(tmp_path, 7, ModuleFiles(net, {"in": 3, "out": 2}), opt.state_dict(),
                           {"prompt_rng": prompt_rng, "generator": gen}, '{"algo": {}}',
                           {"episodes": [1.5, 2.5]}, {"constraint.pt": {"lam": 0.25}})
    assert ckpt == tmp_path / "checkpoints" / "step_000007" and is_checkpoint(ckpt)
    assert latest_checkpoint(tmp_path) == ckpt
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([MODULE_FILE, MODEL_CONFIG, STATE_FILE, CONFIG_FILE,
                                                             "constraint.pt"])
    want = (prompt_rng.random(), torch.rand(1, generator=gen), torch.rand(1))  # what each stream draws next

    fresh = nn.Linear(3, 2)  # other weights, and the global torch RNG moved on
    fresh.load_state_dict(ModuleFiles(fresh, {}).load_weights(ckpt))
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.1)
    other_rng, other_gen = random.Random(9), torch.Generator().manual_seed(9)
    saved = restore(ckpt, fresh_opt, {"prompt_rng": other_rng, "generator": other_gen})
    assert saved.step == 7 and saved.loop_state == {"episodes": [1.5, 2.5]}
    assert (other_rng.random(), torch.rand(1, generator=other_gen), torch.rand(1)) == want
    assert all(torch.equal(t, net.state_dict()[k]) for k, t in fresh.state_dict().items())
    for key, state in opt.state_dict()["state"].items():
        assert torch.equal(fresh_opt.state_dict()["state"][key]["exp_avg"], state["exp_avg"])
    assert load_extra(ckpt, "constraint.pt") == {"lam": 0.25}


def test_a_stream_named_twice_or_missing_is_refused(tmp_path):
    net, opt = _stepped()
    files = ModuleFiles(net, {})
    with pytest.raises(ValueError, match=r"\['step'\] named twice"):
        save_checkpoint(tmp_path, 1, files, None, {}, "{}", {"step": 3})
    with pytest.raises(ValueError, match=r"\['generator'\] named twice"):
        save_checkpoint(tmp_path, 1, files, None, {"generator": torch.Generator()}, "{}", {"generator": 0})
    ckpt = save_checkpoint(tmp_path, 1, files, opt.state_dict(), {"generator": torch.Generator()}, "{}")
    # a text loop resuming a checkpoint without its streams (a control run's) is told what is missing
    with pytest.raises(CheckpointError, match=r"lacks \['prompt_rng', 'sample_rng'\]"):
        restore(ckpt, opt, {"prompt_rng": random.Random(), "sample_rng": torch.Generator()})
