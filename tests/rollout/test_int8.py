"""Int8 rollout weights (`rollout/int8.py`, `generate(..., weights="int8")`).

Two kinds of check. The int8 matmul is held to an error bound derived from its quantisation steps (not fitted
to a CPU). Whole rollouts are held to a stated tolerance on the gap between the int8 sampler's log-probs and
float32 scoring of the same tokens, the gap the training loop's importance weights correct. The float32
decoder itself is unchanged by the refactor that made room for int8: tests/rollout/test_generate_fast_path.py
still holds it to float32 rounding.
"""

import pytest
import torch
from fp32 import gamma
from reduced_rollouts import sample_and_rescore

from feedbackrl.config import ConfigError, RolloutConfig
from feedbackrl.models.logprobs import positions
from feedbackrl.rollout import generate as gen_mod
from feedbackrl.rollout import int8
from feedbackrl.rollout.generate import generate

PROMPTS = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello, world!"]  # different lengths: left padding


def test_int8_matmul_within_its_quantisation_bound():
    # y (M, in) with OUTLIER_CHANNELS planted channels 1000x the others, W (out, in), a bias.
    # Error sources, per output o of row m, over the channels j left to int8 (the planted ones run in float32):
    # - W's per-row step s_o = max_j |W_oj| / 127, rounding error <= s_o / 2 per weight;
    # - y's row scaled into [-1, 1] by its max r_m over those channels, then one per-tensor step a <= 2 / qmax
    #   (qmax 255, 127 with reduce_range), error <= a (rounding plus the zero point's nudge) per element, x r_m;
    # so |err| <= sum_j |y_mj| s_o / 2 + r_m a sum_j (|W_oj| + s_o / 2), plus float32 rounding of the sums.
    g = torch.Generator().manual_seed(0)
    m, n_in, n_out, k = 6, 96, 40, int8.OUTLIER_CHANNELS
    y, w = torch.randn(m, n_in, generator=g), torch.randn(n_out, n_in, generator=g)
    bias = torch.randn(n_out, generator=g)
    planted = torch.randperm(n_in, generator=g)[:k]
    y[:, planted] *= 1000.0
    lin = int8.Linear(w, bias)
    truth = y.double() @ w.double().T + bias.double()
    rest = torch.ones(n_in, dtype=torch.bool)
    rest[planted] = False
    # 8-bit activations only where the CPU has VNNI: without it the kernel's int16 pair sums saturate (an error
    # of ~9 here on an AVX2-only CPU), which is why the decoder keeps them to 7 bits there (`reduce_range`)
    for reduce, qmax in ((True, 127),) if int8.reduce_range() else ((False, 255), (True, 127)):
        got = lin(y, reduce)
        s = w.abs().amax(1).double() / 127  # (out,)
        yr, wr = y[:, rest].double().abs(), w[:, rest].double().abs()
        r = yr.amax(1, keepdim=True)  # (M, 1)
        bound = yr.sum(1, keepdim=True) * s / 2 + r * (2 / qmax) * (wr.sum(1) + s * rest.sum() / 2)
        # float32 rounding: the sums, the activation's step, the weight row's step, the row scale, the bias
        bound += gamma(n_in + 4) * (y.double().abs() @ w.double().abs().T + bias.double().abs())
        err = (got.double() - truth).abs()
        assert (err <= bound).all(), f"reduce_range={reduce}: error {err.max():.3e} above its bound"
        # the planted channels are exact: without them in float32 the error would be ~1000x the bound
        assert err.max() < 0.05 * truth.abs().max(), err.max()


def test_packed_weights_are_each_rows_127_levels():
    # the kernel multiplies by q (int8, step 1); each output column is then scaled by its row's step s
    g = torch.Generator().manual_seed(2)
    w = torch.randn(24, 40, generator=g)
    w[3] = 0.0  # an all-zero row: a tiny step, q = 0
    lin = int8.Linear(w, None)
    q = torch.ops.quantized.linear_unpack(lin.packed)[0]
    assert q.qscheme() == torch.per_tensor_affine and q.q_scale() == 1.0 and q.q_zero_point() == 0
    s = w.abs().amax(1) / 127
    assert torch.equal(lin.scale[torch.arange(24) != 3], s[torch.arange(24) != 3])
    levels = q.int_repr()
    assert levels.abs().amax(1).tolist() == [127] * 3 + [0] + [127] * 20  # every row's largest weight at +-127
    err = (int8.dequantized(lin) - w).abs()
    assert (err <= s[:, None] / 2 * (1 + 2**-20)).all()  # rounding to the nearest level


def test_activations_keep_7_bits_where_fbgemm_is_capped_below_vnni(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: True)
    assert not int8.reduce_range()
    for cap in ("AVX2", "avx512"):
        monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", cap)
        assert int8.reduce_range()
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX512_E1")
    assert not int8.reduce_range()
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: False)
    assert int8.reduce_range()


def test_outlier_channels_are_taken_out_of_the_int8_product():
    # one channel of y 1000x the others: with it in int8, the per-row scale leaves the other channels ~0 levels
    g = torch.Generator().manual_seed(1)
    y, w = torch.randn(4, 64, generator=g), torch.randn(32, 64, generator=g)
    y[:, 5] *= 1000.0
    truth = y.double() @ w.double().T
    with_outliers = (int8.Linear(w, None)(y, int8.reduce_range()).double() - truth).abs().max()
    int8.OUTLIER_CHANNELS, saved = 0, int8.OUTLIER_CHANNELS
    try:
        without = (int8.Linear(w, None)(y, int8.reduce_range()).double() - truth).abs().max()
    finally:
        int8.OUTLIER_CHANNELS = saved
    assert with_outliers * 20 < without, (with_outliers, without)


# The stated tolerance of whole int8 rollouts against float32 scoring of the same tokens, relative to the spread
# of the tempered logits, sigma = (mean over positions of the logits' std over the vocabulary) / temperature:
# each int8 matmul is off by about a 1/127 step of its inputs' range, so a log-prob gap scales with the logits.
# Mean gap <= 0.1 sigma, largest <= sigma. A broken int8 path (a wrong scale, a lost norm weight) is off by
# order sigma on every token. On SmolLM2-135M the mean gap is 0.06 nats (docs/performance.md).
MEAN_GAP, MAX_GAP = 0.1, 1.0


@pytest.mark.parametrize("model_name", ["peaked_lm", "peaked_qwen", "smol_lm"])
def test_int8_rollouts_match_fp32_logprobs_within_the_stated_tolerance(model_name, request):
    model = request.getfixturevalue(model_name)
    tok = request.getfixturevalue("smol_tokenizer" if model_name == "smol_lm" else "tokenizer")
    temperature = 0.8
    ro, fp32, ids, mask = sample_and_rescore(model, tok, PROMPTS * 4, "int8", temperature)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits[mask.bool()]
    sigma = logits.std(-1).mean().item() / temperature
    done = ro.completion_mask.bool()
    gap = (ro.logprobs - fp32)[done].abs()
    assert gap.mean() <= MEAN_GAP * sigma and gap.max() <= MAX_GAP * sigma, (gap.mean().item(), gap.max().item(),
                                                                             sigma)
    assert (ro.logprobs[~done] == 0).all()
    # it is a real int8 path: not bit-equal to the float32 decoder's log-probs
    ref = generate(model, tok, PROMPTS * 4, 12, temperature=temperature, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(ref.logprobs, ro.logprobs)


def test_int8_greedy_mostly_agrees_with_fp32_greedy(peaked_lm, tokenizer):
    fp32 = generate(peaked_lm, tokenizer, PROMPTS * 2, 8, greedy=True)
    q = generate(peaked_lm, tokenizer, PROMPTS * 2, 8, greedy=True, weights="int8")
    first = (fp32.completion_ids[:, 0] == q.completion_ids[:, 0]).float().mean()
    assert first == 1.0, (fp32.texts, q.texts)  # the peaked model's first tokens have clear gaps


def test_int8_refused_where_the_fast_decoder_does_not_run(peaked_lm, tokenizer, monkeypatch):
    with pytest.raises(ValueError, match="unknown rollout weights 'int4'"):
        generate(peaked_lm, tokenizer, PROMPTS, 4, weights="int4")
    monkeypatch.setattr(gen_mod, "fast_path_ok", lambda model: False)
    with pytest.raises(ValueError, match="need the fast decoder"):
        generate(peaked_lm, tokenizer, PROMPTS, 4, weights="int8")


def test_int8_collect_carries_the_samplers_logprobs(tiny_model_dir, tokenizer):
    import random

    from transformers import AutoModelForCausalLM

    from feedbackrl.config import TaskConfig
    from feedbackrl.envs.registry import make_task
    from feedbackrl.episodes.kinds import collect
    from feedbackrl.episodes.single_turn import task_scorer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    task = make_task(TaskConfig(name="addition"))
    batches = {}
    for weights in ("fp32", "int8"):
        cfg = RolloutConfig(prompts_per_step=2, group_size=3, max_new_tokens=4, weights=weights)
        batches[weights] = collect(model, tokenizer, task, task_scorer(task), cfg, random.Random(0),
                                   torch.Generator().manual_seed(0))
    assert batches["fp32"].logprobs is None  # on-policy: no correction
    q = batches["int8"]
    assert q.logprobs is not None and q.logprobs.shape == q.completion_ids.shape
    assert (q.logprobs[q.completion_mask == 0] == 0).all()


def test_int8_config_refuses_what_it_does_not_support():
    from feedbackrl.config import RunConfig

    with pytest.raises(ValueError, match="rollout.weights = 'int8' samples the rollouts of grpo and rloo"):
        RunConfig.model_validate({"algo": {"name": "ppo"}, "rollout": {"weights": "int8"}})
    with pytest.raises(ValueError, match="rollout.backend = 'vllm'"):
        RunConfig.model_validate({"rollout": {"weights": "int8", "backend": "vllm"}})
    assert RunConfig.model_validate({"rollout": {"weights": "int8"}}).rollout.weights == "int8"
    assert issubclass(ConfigError, ValueError)


def test_grpo_on_int8_rollouts_weights_tokens_by_the_fp32_int8_gap(tokenizer, tmp_path):
    from feedbackrl.config import TaskConfig, build_config
    from feedbackrl.envs.registry import make_task
    from feedbackrl.log import MemorySink
    from feedbackrl.models.tiny import build_model
    from feedbackrl.train.grpo import train_grpo

    def run(weights: str) -> list[dict]:
        cfg = build_config({"rollout": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 4,
                                        "weights": weights},
                            "algo": {"steps": 2, "lr": 3e-2}, "train": {"seed": 3}, "monitors": {"enabled": False}})
        model = build_model(tokenizer, "tiny", seed=0)
        with torch.no_grad():  # weights large enough that int8 rounding moves the log-probs measurably
            for p in model.parameters():
                if p.dim() == 2:
                    p.mul_(15.0)
        sink = MemorySink()
        train_grpo(cfg, model, tokenizer, make_task(TaskConfig(name="addition")), tmp_path / weights, sink)
        return [m for _, m in sink.rows if "loss/policy" in m]

    fp32, q = run("fp32"), run("int8")
    assert all("is_weight/mean" not in m for m in fp32)  # on-policy: no correction
    weights = [m["is_weight/mean"] for m in q]
    assert len(weights) == 2 and all(0.5 < w < 2.0 and w != 1.0 for w in weights), weights
