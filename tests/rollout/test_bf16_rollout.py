"""Bf16 rollout weights (`rollout/bf16.py`, `generate(..., weights="bf16")`).

The bf16 matmul is held to the error bound its roundings give (inputs and output each rounded to bf16, relative
error at most u = 2^-8, float32 accumulation), and whole rollouts to a tolerance on the gap between the bf16
sampler's log-probs and float32 scoring of the same tokens derived from the same u. Both need bf16 instructions
(AMX or AVX-512 BF16) and are skipped, with the reason, on a CPU without them; the refusals run everywhere.
"""

import math
import random

import pytest
import torch
from fp32 import gamma
from reduced_rollouts import sample_and_rescore

from feedbackrl.config import ConfigError, RolloutConfig, RunConfig, TaskConfig
from feedbackrl.models.logprobs import positions
from feedbackrl.rollout import bf16
from feedbackrl.rollout import generate as gen_mod
from feedbackrl.rollout.generate import generate

PROMPTS = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello, world!"]  # different lengths: left padding
U = bf16.UNIT_ROUNDOFF
needs_bf16 = pytest.mark.skipif(bool(bf16.missing()), reason="this CPU has no bf16 instructions (amx_bf16 or "
                                                             "avx512_bf16): bf16 rollout weights are refused here")


@needs_bf16
def test_bf16_matmul_within_its_rounding_bound():
    # y (M, in) with a few channels 1000x the others (bf16 rounds each element relative to itself, so unlike int8
    # they cost nothing), W (out, in), the RMSNorm weight folded in, a bias. Per output, with A = sum_j |y_j w_j|:
    # the inputs' roundings give (2u + u^2) A, float32 accumulation gamma(in) (1 + u)^2 A, the output's rounding
    # u (1 + 3u) A at most; the bias add and the fold's float32 product another 2^-23 (A + |b|).
    g = torch.Generator().manual_seed(0)
    m, n_in, n_out = 6, 96, 40
    y, w = torch.randn(m, n_in, generator=g), torch.randn(n_out, n_in, generator=g)
    scale, bias = torch.rand(n_in, generator=g) + 0.5, torch.randn(n_out, generator=g)
    y[:, torch.randperm(n_in, generator=g)[:4]] *= 1000.0
    mats = gen_mod._Bf16Matmuls()
    wq, b = mats.prepare(w.clone(), bias, scale)
    assert wq.dtype == torch.bfloat16 and wq.shape == (n_out, n_in)
    ws = w.double() * scale.double()
    truth = y.double() @ ws.T + bias.double()
    a = y.double().abs() @ ws.abs().T
    bound = (3 * U + 4 * U**2) * a + gamma(n_in) * (1 + U) ** 2 * a + 2.0**-23 * (a + bias.double().abs())
    for got in (mats.mm(y, wq, b), _into(mats, y, wq, b), _added(mats, y, wq, b)):
        err = (got.double() - truth).abs()
        assert (err <= bound).all(), f"error {err.max():.3e} above its bound at {(err / bound).argmax()}"
    # a real bf16 product: errors of order u, far above float32's
    assert err.max() > 100 * gamma(n_in) * a.max()


def _into(mats, y, w, b):
    out = torch.empty(y.shape[0], w.shape[0])
    mats.mm_into(out, y, w, b)
    return out


def _added(mats, y, w, b):
    x = torch.zeros(y.shape[0], w.shape[0])
    mats.mm_add(x, y, w, b)
    return x


# Whole rollouts: each logit carries R = 12 L + 3 bf16 roundings (per layer four matmuls, each rounding its input,
# its weight and its output; then the LM head's three), each a relative error <= u of a hidden state whose effect
# on a logit is bounded by S = max_v sum_h |h_h W_vh| (the LM head's largest sum of magnitudes, as tests/fp32.py
# bounds float32 rounding). Treated as independent and mean-zero (Higham and Mary 2019), a logit's error is within
# lam sqrt(R) u S with probability 1 - 2 exp(-lam^2 / 2), its root mean square within sqrt(R) u S; a log-prob (a
# logit minus a logsumexp) is off by at most twice its worst logit's error. So: every token's gap within
# 2 * 8 sqrt(R) u S (lam = 8, as tests/fp32.py), and the mean gap within 2 sqrt(R) u mean(S). Measured on these
# models (two seeds): the largest gap 1.2-2.3 x 2uS, the mean 0.2-0.3 x 2uS; a decoder that dropped a norm weight
# or a bias is off by order of the logits' spread on every token (and the greedy check below).
@needs_bf16
@pytest.mark.parametrize("model_name", ["peaked_lm", "peaked_qwen", "smol_lm"])
def test_bf16_rollouts_match_fp32_logprobs_within_the_rounding_tolerance(model_name, request):
    model = request.getfixturevalue(model_name)
    tok = request.getfixturevalue("smol_tokenizer" if model_name == "smol_lm" else "tokenizer")
    temperature = 0.8
    ro, fp32, ids, mask = sample_and_rescore(model, tok, PROMPTS * 4, "bf16", temperature)
    with torch.no_grad():
        hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).last_hidden_state
        head = model.get_output_embeddings()
        s = (hidden.abs() @ head.weight.abs().T)[mask.bool()].amax(-1) / temperature  # S per position
    root_r = math.sqrt(12 * model.config.num_hidden_layers + 3)
    done = ro.completion_mask.bool()
    gap = (ro.logprobs - fp32)[done].abs()
    assert gap.max() <= 2 * 8 * root_r * U * s.max(), (gap.max().item(), s.max().item())
    assert gap.mean() <= 2 * root_r * U * s.mean(), (gap.mean().item(), s.mean().item())
    assert (ro.logprobs[~done] == 0).all()
    ref = generate(model, tok, PROMPTS * 4, 12, temperature=temperature, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(ref.logprobs, ro.logprobs)  # a real bf16 path


@needs_bf16
def test_bf16_greedy_agrees_with_fp32_greedy_on_clear_gaps(peaked_lm, tokenizer):
    fp32 = generate(peaked_lm, tokenizer, PROMPTS * 2, 8, greedy=True)
    b = generate(peaked_lm, tokenizer, PROMPTS * 2, 8, greedy=True, weights="bf16")
    assert torch.equal(fp32.completion_ids[:, 0], b.completion_ids[:, 0]), (fp32.texts, b.texts)


def test_bf16_is_refused_naming_the_cpu_feature_where_it_is_missing(peaked_lm, tokenizer, monkeypatch):
    from feedbackrl.envs.registry import make_task
    from feedbackrl.episodes.kinds import check_rollout

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # that cap is a refusal of its own (below)
    monkeypatch.setattr(bf16, "cpu_features", lambda: [])
    with pytest.raises(ValueError, match=r"needs a CPU with bf16 instructions \(AMX, flag amx_bf16, or AVX-512 "
                                         r"BF16, flag avx512_bf16\)"):
        generate(peaked_lm, tokenizer, PROMPTS, 4, weights="bf16")
    # before any work: the run path's check of the recipe against this machine
    with pytest.raises(ConfigError, match="rollout.weights = 'bf16' needs a CPU with bf16 instructions"):
        check_rollout(RolloutConfig(weights="bf16"), make_task(TaskConfig(name="addition")))
    check_rollout(RolloutConfig(weights="int8"), make_task(TaskConfig(name="addition")))  # int8 is not affected
    monkeypatch.setattr(bf16, "cpu_features", lambda: ["avx512_bf16"])
    assert bf16.missing() is None
    assert "CPU only" in bf16.missing("cuda")


def test_bf16_is_refused_where_onednn_is_capped_below_bf16(monkeypatch):
    monkeypatch.setattr(bf16, "cpu_features", lambda: ["avx512_bf16"])
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert "ONEDNN_MAX_CPU_ISA=AVX2 keeps it below them" in bf16.missing()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert bf16.missing() is None


def test_bf16_refused_where_the_fast_decoder_does_not_run(peaked_lm, tokenizer, monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(bf16, "cpu_features", lambda: ["amx_bf16"])
    monkeypatch.setattr(gen_mod, "fast_path_ok", lambda model: False)
    with pytest.raises(ValueError, match="rollout weights 'bf16' need the fast decoder"):
        generate(peaked_lm, tokenizer, PROMPTS, 4, weights="bf16")


def test_bf16_config_is_validated_as_int8_is():
    with pytest.raises(ValueError, match="rollout.weights = 'bf16' samples the rollouts of grpo and rloo"):
        RunConfig.model_validate({"algo": {"name": "ppo"}, "rollout": {"weights": "bf16"}})
    with pytest.raises(ValueError, match="rollout.backend = 'vllm'"):
        RunConfig.model_validate({"rollout": {"weights": "bf16", "backend": "vllm"}})
    with pytest.raises(ValueError, match="scale.rollout_workers = 2"):
        RunConfig.model_validate({"rollout": {"weights": "bf16"}, "scale": {"rollout_workers": 2}})
    with pytest.raises(ValueError, match="fp32', 'int8' or 'bf16'"):
        RunConfig.model_validate({"rollout": {"weights": "fp16"}})
    # never the default; the recipe's choice is kept whatever this CPU has (the run checks the CPU)
    assert RolloutConfig().weights == "fp32"
    assert RunConfig.model_validate({"rollout": {"weights": "bf16"}}).rollout.weights == "bf16"


@needs_bf16
def test_bf16_collect_carries_the_samplers_logprobs(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from feedbackrl.envs.registry import make_task
    from feedbackrl.episodes.kinds import collect
    from feedbackrl.episodes.single_turn import task_scorer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    task = make_task(TaskConfig(name="addition"))
    cfg = RolloutConfig(prompts_per_step=2, group_size=3, max_new_tokens=4, weights="bf16")
    batch = collect(model, tokenizer, task, task_scorer(task), cfg, random.Random(0), torch.Generator().manual_seed(0))
    assert batch.logprobs is not None and batch.logprobs.shape == batch.completion_ids.shape
    assert (batch.logprobs[batch.completion_mask == 0] == 0).all()


@needs_bf16
def test_grpo_on_bf16_rollouts_weights_tokens_by_the_fp32_bf16_gap(tokenizer, tmp_path):
    from feedbackrl.config import build_config
    from feedbackrl.envs.registry import make_task
    from feedbackrl.log import MemorySink
    from feedbackrl.models.tiny import build_model
    from feedbackrl.train.grpo import train_grpo

    cfg = build_config({"rollout": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 4, "weights": "bf16"},
                        "algo": {"steps": 2, "lr": 3e-2}, "train": {"seed": 3}, "monitors": {"enabled": False}})
    model = build_model(tokenizer, "tiny", seed=0)
    with torch.no_grad():  # weights large enough that bf16 rounding moves the log-probs measurably
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(15.0)
    sink = MemorySink()
    train_grpo(cfg, model, tokenizer, make_task(TaskConfig(name="addition")), tmp_path / "bf16", sink)
    weights = [m["is_weight/mean"] for _, m in sink.rows if "loss/policy" in m]
    assert len(weights) == 2 and all(0.5 < w < 2.0 and w != 1.0 for w in weights), weights
