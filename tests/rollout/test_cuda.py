"""Rollouts and the training forward on a CUDA model: the same results as on the CPU.

Skipped without a GPU (CI has none); run on a GPU machine with `pytest -m gpu tests/rollout/test_cuda.py`.
The prompts are padded to different lengths (masks), and the Qwen model has GQA and q/k/v biases.
"""

import pytest
import torch

from feedbackrl.models import logprobs as lp_mod
from feedbackrl.models.logprobs import sequence_logprobs
from feedbackrl.rollout import generate as gen_mod
from feedbackrl.rollout.generate import generate

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello, world!"]
MODELS = ["peaked_lm", "peaked_qwen"]


@pytest.fixture
def on_gpu(request):
    """A CUDA copy of a read-only CPU fixture model, and the CPU model itself."""
    import copy

    def get(name: str):
        cpu = request.getfixturevalue(name)
        return cpu, copy.deepcopy(cpu).cuda()

    return get


@pytest.mark.parametrize("model_name", MODELS)
def test_greedy_generation_on_the_gpu_matches_the_cpu(model_name, tokenizer, on_gpu):
    cpu, gpu = on_gpu(model_name)
    want = generate(cpu, tokenizer, PROMPTS * 2, 10, greedy=True)
    got = generate(gpu, tokenizer, PROMPTS * 2, 10, greedy=True)
    assert got.completion_ids.device.type == "cuda"
    assert torch.equal(got.completion_ids.cpu(), want.completion_ids)
    torch.testing.assert_close(got.logprobs.cpu(), want.logprobs, rtol=0, atol=1e-4)
    assert got.texts == want.texts


@pytest.mark.parametrize("model_name", MODELS)
def test_a_cpu_seed_samples_the_same_tokens_on_the_gpu(model_name, tokenizer, on_gpu):
    cpu, gpu = on_gpu(model_name)
    want = generate(cpu, tokenizer, PROMPTS * 4, 12, temperature=0.9, generator=torch.Generator().manual_seed(7))
    got = generate(gpu, tokenizer, PROMPTS * 4, 12, temperature=0.9, generator=torch.Generator().manual_seed(7))
    assert torch.equal(got.completion_ids.cpu(), want.completion_ids)
    torch.testing.assert_close(got.logprobs.cpu(), want.logprobs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("model_name", MODELS)
def test_the_fast_training_forward_on_the_gpu_matches_the_hf_forward(model_name, tokenizer, on_gpu, monkeypatch):
    _, gpu = on_gpu(model_name)
    ro = generate(gpu, tokenizer, PROMPTS * 3, 8, generator=torch.Generator().manual_seed(3))
    args = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)

    def logprobs_and_grads():
        gpu.zero_grad()
        lp, _ = sequence_logprobs(gpu, *args)
        (lp.sum() / ro.completion_mask.sum()).backward()
        return lp.detach(), {n: p.grad.detach().clone() for n, p in gpu.named_parameters() if p.grad is not None}

    assert lp_mod.train_fast_path_ok(gpu)
    fast_lp, fast_grads = logprobs_and_grads()
    monkeypatch.setattr(lp_mod, "train_fast_path_ok", lambda model: False)
    hf_lp, hf_grads = logprobs_and_grads()
    torch.testing.assert_close(fast_lp, hf_lp, rtol=0, atol=1e-4)
    assert fast_grads.keys() == hf_grads.keys()
    for name, g in hf_grads.items():
        torch.testing.assert_close(fast_grads[name], g, rtol=1e-3, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_the_gpu_decoder_keeps_its_cache_on_the_gpu_and_skips_the_cpu_kernel(peaked_lm, on_gpu):
    _, gpu = on_gpu("peaked_lm")
    decoder = gen_mod._LlamaDecoder(gpu, torch.ones(3, 4, dtype=torch.long, device="cuda"), 5)
    assert decoder.native is None
    assert all(k.device.type == "cuda" for _, k, _ in decoder.cache)
