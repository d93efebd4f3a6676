"""Int8 rollout weights are prepared once per weight version (`generate._prepared`), not per call.

A stale copy must never be used: after any change of the model's weights, however made, a rollout equals one
from weights prepared afresh (the cache emptied), bit for bit; and rollouts following training steps rebuild
exactly once after each optimizer step.
"""

import copy

import pytest
import torch

from feedbackrl.rollout import bf16, int8
from feedbackrl.rollout import generate as gen_mod
from feedbackrl.rollout.generate import generate

PROMPTS = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello, world!"]
KINDS = ["int8"]  # the weights `generate` keeps across calls (`CACHED_WEIGHTS`)


@pytest.fixture
def model(peaked_lm):
    return copy.deepcopy(peaked_lm)  # the shared fixture stays untouched


@pytest.fixture
def builds(monkeypatch):
    """How many times the decoder's weights were prepared (one count per `build`, not per matmul)."""
    count = [0]
    real = gen_mod._prepared

    def counted(model, weights, build):
        def build_counted():
            count[0] += 1
            return build()
        return real(model, weights, build_counted)

    monkeypatch.setattr(gen_mod, "_prepared", counted)
    return count


def sample(model, tokenizer, weights, seed=3):
    return generate(model, tokenizer, PROMPTS, 6, temperature=1.0, generator=torch.Generator().manual_seed(seed),
                    weights=weights)


def fresh(model, tokenizer, weights):
    gen_mod._PREPARED.pop(model, None)
    return sample(model, tokenizer, weights)


def same(a, b) -> bool:
    return torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)


@pytest.mark.parametrize("weights", KINDS)
def test_reused_while_the_weights_stay_the_same(model, tokenizer, builds, weights):
    first = sample(model, tokenizer, weights)
    again = sample(model, tokenizer, weights)
    assert builds[0] == 1
    assert same(first, again)


def test_only_int8_weights_are_kept():
    assert tuple(KINDS) == gen_mod.CACHED_WEIGHTS


@pytest.mark.parametrize("weights", ["fp32", pytest.param("bf16", marks=pytest.mark.skipif(
    bool(bf16.missing()), reason="this CPU has no bf16 instructions (amx_bf16 or avx512_bf16)"))])
def test_float32_and_bf16_weights_are_prepared_on_every_call(model, tokenizer, builds, weights):
    sample(model, tokenizer, weights)
    sample(model, tokenizer, weights)
    assert builds[0] == 0 and model not in gen_mod._PREPARED


def _edit_no_grad(p):
    with torch.no_grad():
        p[0] += 0.5  # bumps the version counter


def _edit_data(p):
    p.data[0] += 0.5  # through .data: no version counter sees it


def _edit_one_value_by_one_ulp(p):
    p.data.view(-1)[7] = torch.nextafter(p.data.view(-1)[7], torch.tensor(float("inf")))


def _load_state_dict(p, model):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    name = next(k for k, v in model.named_parameters() if v is p)
    state[name][0] += 0.5
    model.load_state_dict(state)


@pytest.mark.parametrize("weights", KINDS)
@pytest.mark.parametrize("edit", [_edit_no_grad, _edit_data, _edit_one_value_by_one_ulp, "load_state_dict"])
def test_a_changed_weight_is_never_sampled_from_a_stale_copy(model, tokenizer, weights, edit):
    before = sample(model, tokenizer, weights)
    p = model.model.layers[0].mlp.down_proj.weight
    if edit == "load_state_dict":
        _load_state_dict(p, model)
    else:
        edit(p)
    kept = gen_mod._PREPARED[model][weights][2]
    after = sample(model, tokenizer, weights)
    assert gen_mod._PREPARED[model][weights][2] is not kept  # rebuilt
    assert same(after, fresh(model, tokenizer, weights))
    if edit is not _edit_one_value_by_one_ulp:
        assert not same(before, after)  # the edit matters to the rollout, so the comparison above has teeth


@pytest.mark.parametrize("weights", KINDS)
def test_the_embedding_and_the_final_norm_are_part_of_the_key(model, tokenizer, weights):
    sample(model, tokenizer, weights)
    model.model.norm.weight.data.mul_(1.5)  # folded into the LM head's prepared weight
    assert same(sample(model, tokenizer, weights), fresh(model, tokenizer, weights))


@pytest.mark.parametrize("weights", KINDS)
def test_rebuilt_exactly_once_after_each_optimizer_step(model, tokenizer, builds, weights):
    # fused AdamW (the loops' optimizer) changes parameters in place without bumping their version counters
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    sample(model, tokenizer, weights)
    for _ in range(2):
        ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        before = builds[0]
        chunks = [sample(model, tokenizer, weights, seed=s) for s in (3, 4, 5)]  # e.g. a rollout in three chunks
        assert builds[0] == before + 1
        assert same(chunks[0], fresh(model, tokenizer, weights))


def test_int8_packs_each_weight_once_per_version(model, tokenizer, monkeypatch):
    packs = [0]
    real = int8.pack

    def counted(weight):
        packs[0] += 1
        return real(weight)

    monkeypatch.setattr(int8, "pack", counted)
    sample(model, tokenizer, "int8")
    per_build = packs[0]
    assert per_build == 4 * len(model.model.layers) + 1  # q/k/v, o, gate/up, down per layer; the LM head
    sample(model, tokenizer, "int8")
    assert packs[0] == per_build
