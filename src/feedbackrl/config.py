"""Run configuration: pydantic models with `extra="forbid"`, so a typo is an error, not a default.

A recipe is a small TOML file that sets only what differs from these defaults; the CLI overrides
single values with dotted keys (`--set algo.lr=3e-4`). Every error names the field, the value
given and what is allowed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A recipe or override that does not describe a valid run."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field("tiny", description='HF model dir or hub id; "tiny" builds a tiny local model')
    size: Literal["tiny", "small"] = Field("tiny", description="size of the locally built model (path=tiny)")
    init_seed: int = Field(0, description="seed of the random init of a locally built model")
    chat_template: Literal["auto", "on", "off"] = Field(
        "auto", description="render prompts with the tokenizer's chat template: auto = when it has one")
    system_prompt: str = Field("", description='system turn of chat-rendered prompts; "" = the template\'s default')


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRAConfig(Section):
    """LoRA adapters (peft, the `lora` extra) instead of training every weight; rank 0 = off."""

    rank: int = Field(0, ge=0, le=1024, description="adapter rank r; 0 = full fine-tuning (no adapters)")
    alpha: float = Field(32.0, gt=0, description="adapter scale numerator: the update is (alpha / rank) * B @ A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input while training")
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS),
                                      description="names of the linear layers that get adapters")


class TaskConfig(Section):
    name: str = Field("addition", description="task registry key, see `feedbackrl tasks`")
    options: dict[str, Any] = Field(default_factory=dict, description="task constructor options")
    heldout_size: int = Field(200, ge=1, le=100_000, description="held-out problems used for eval")


class SFTConfig(Section):
    steps: int = Field(0, ge=0, description="SFT warm-start steps on the task's demonstrations; 0 = none")
    batch_size: int = Field(64, ge=1, description="demonstrations per SFT step")
    lr: float = Field(1e-3, gt=0, le=1, description="AdamW learning rate for SFT")
    warmup_steps: int = Field(20, ge=0, description="linear LR warm-up steps")


class RolloutConfig(Section):
    prompts_per_step: int = Field(16, ge=1, description="B: prompts sampled per training step")
    group_size: int = Field(8, ge=1, description="G: completions per prompt")
    max_new_tokens: int = Field(8, ge=1, le=4096, description="cap on generated tokens")
    temperature: float = Field(1.0, gt=0, le=10, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    min_new_tokens: int = Field(0, ge=0, description="EOS suppressed for this many tokens (as HF generate)")
    truncated_fails: bool = Field(False, description="score completions cut off by max_new_tokens as failed (0)")
    backend: Literal["native", "vllm"] = Field("native", description=(
        "what samples the training rollouts: our own decoder (native), or vLLM beside the learner: on its GPU "
        "(the vllm extra), or on the CPU with vLLM's CPU build (make vllm-venv); grpo and rloo; docs/scale.md)"))
    weights: Literal["fp32", "int8", "bf16"] = Field("fp32", description=(
        "what the native decoder's matmuls run on: float32, int8 weights and activations, or bf16 ones (bf16 only "
        "where the CPU has bf16 instructions, AMX or AVX-512 BF16; CPU; float32 Llama/Qwen2 models; grpo and rloo, "
        "single-turn tasks, one process); the loop then weights each token by min(pi_fp32 / pi_sampler, "
        "scale.importance_cap) (docs/performance.md, 'Int8 rollout weights', 'Bf16 rollout weights')"))
    vllm_memory: float = Field(0.3, gt=0, lt=1, description=(
        "backend = vllm: fraction of the GPU's memory vLLM takes for its weights and KV cache (the learner "
        "needs the rest); with the CPU build, of the machine's memory unless VLLM_CPU_KVCACHE_SPACE (GiB) is set"))

    @model_validator(mode="after")
    def _min_below_max(self) -> RolloutConfig:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens={self.min_new_tokens} must be <= max_new_tokens={self.max_new_tokens}")
        return self


class GRPOConfig(Section):
    name: Literal["grpo"] = Field("grpo", description="algorithm")
    steps: int = Field(100, ge=0, description="training steps (one rollout batch each)")
    lr: float = Field(2e-4, gt=0, le=1, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    epochs: int = Field(1, ge=1, le=64, description="optimisation passes over each rollout batch")
    minibatches: int = Field(1, ge=1, description="optimizer steps per epoch (splits the batch)")
    clip_low: float = Field(0.2, ge=0, le=1, description="PPO clip below 1 (ratio >= 1 - clip_low)")
    clip_high: float = Field(0.2, ge=0, le=10, description="PPO clip above 1; > clip_low is clip-higher")
    kl_coef: float = Field(0.0, ge=0, description="beta of the k3 KL to a frozen reference; 0 loads none")
    scale_advantages: bool = Field(True, description="divide by group std (False = Dr. GRPO)")
    aggregation: Literal["token_mean", "sequence_mean", "fixed_length_sum"] = Field(
        "token_mean", description="how per-token losses become a scalar")


class RLOOConfig(GRPOConfig):
    """RLOO: the GRPO loop with leave-one-out advantages (Ahmadian et al. 2024)."""

    name: Literal["rloo"] = Field("rloo", description="algorithm")
    scale_advantages: bool = Field(False, description="also divide the leave-one-out advantages by the group's std")


class PPOConfig(Section):
    name: Literal["ppo"] = Field("ppo", description="algorithm")
    steps: int = Field(100, ge=0, description="training steps (one rollout batch each)")
    lr: float = Field(2e-4, gt=0, le=1, description="AdamW learning rate (policy and value head)")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    epochs: int = Field(2, ge=1, le=64, description="optimisation passes over each rollout batch")
    minibatches: int = Field(2, ge=1, description="optimizer steps per epoch (splits the batch)")
    clip: float = Field(0.2, gt=0, le=1, description="PPO policy ratio clip")
    value_clip: float = Field(0.2, gt=0, description="clip of the value change around the rollout-time value")
    vf_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    kl_coef: float = Field(0.05, ge=0, description="beta of the per-token KL penalty folded into the reward")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    whiten_advantages: bool = Field(True, description="normalise advantages over the batch's tokens")


class DPOConfig(Section):
    name: Literal["dpo"] = Field("dpo", description="algorithm")
    loss: Literal["dpo", "ipo", "pro"] = Field("dpo", description="pairwise dpo/ipo, or listwise pro (rankings)")
    beta: float = Field(0.1, gt=0, description="DPO's beta (IPO's tau; PRO's score scale)")
    length_average: bool = Field(False, description=(
        "ipo only: per-token mean response log-probs instead of sums (TRL's IPO, so a TRL beta carries over)"))
    epochs: int = Field(2, ge=1, le=100, description="passes over the preference data")
    batch_size: int = Field(64, ge=1, description="pairs (or rankings) per optimizer step")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step (must divide batch_size)")
    lr: float = Field(1e-4, gt=0, le=1, description="AdamW learning rate")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")

    @model_validator(mode="after")
    def _average_is_ipo(self) -> DPOConfig:
        if self.length_average and self.loss != "ipo":
            raise ValueError(f"length_average is TRL's form of loss = 'ipo'; got loss = {self.loss!r}")
        return self


class RewardModelConfig(Section):
    name: Literal["reward_model"] = Field("reward_model", description="algorithm")
    kind: Literal["reward", "cost"] = Field("reward", description="what the scalar head means (cost: lower is safer)")
    head: Literal["per_token", "last_token"] = Field(
        "per_token", description="per-token scores summed over the response, or one score at the last token")
    epochs: int = Field(3, ge=1, le=100, description="passes over the preference pairs")
    batch_size: int = Field(64, ge=1, description="pairs per optimizer step")
    lr: float = Field(3e-4, gt=0, le=1, description="AdamW learning rate (backbone and head)")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")


class OnlineRewardModelConfig(RewardModelConfig):
    """The online labelling loop: the reward model retrains as labels arrive over the app's API ([online])."""

    name: Literal["online_reward_model"] = Field("online_reward_model", description="algorithm")


class SFTOnlyConfig(Section):
    """Supervised fine-tuning as the algorithm itself (the [sft] section's settings), evaluated before and after."""

    name: Literal["sft"] = Field("sft", description="algorithm")


class ControlPPOConfig(Section):
    """PPO for a control policy (`[control]`: a gymnasium environment, an MLP actor-critic; docs/control.md)."""

    name: Literal["control_ppo"] = Field("control_ppo", description="algorithm")
    steps: int = Field(50, ge=0, description="training steps, one rollout of control.num_envs x "
                       "control.rollout_steps environment steps each")
    lr: float = Field(2.5e-4, gt=0, le=1, description="Adam learning rate (actor and critic), annealed linearly "
                      "towards lr_final x lr")
    lr_final: float = Field(0.0, ge=0, le=1, allow_inf_nan=False, description=(
        "where the learning rate's linear annealing heads, as a fraction of lr: update u of algo.steps trains at "
        "lr x (1 - (1 - lr_final) (u - 1) / steps); 0 = to 0 (CleanRL's schedule), 1 = constant"))
    max_grad_norm: float = Field(0.5, gt=0, description="gradient clipping norm")
    epochs: int = Field(4, ge=1, le=64, description="optimisation passes over each rollout")
    minibatches: int = Field(4, ge=1, description="optimizer steps per epoch (splits the rollout)")
    clip: float = Field(0.2, gt=0, le=1, description="PPO policy ratio clip")
    value_clip: float = Field(0.2, gt=0, description="clip of the value change around the rollout-time value")
    vf_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    ent_coef: float = Field(0.0, ge=0, description="weight of the entropy bonus")
    gamma: float = Field(0.99, ge=0, le=1, description="discount")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")


class TeacherConfig(Section):
    """A simulated teacher with B-Pref's irrationalities (Lee et al. 2021), its gold the environment's reward."""

    beta: float | None = Field(None, gt=0, description="rationality: P(first) = sigmoid(beta * (R_1 - R_2)); "
                               "none = perfectly rational (always the higher return)")
    mistake: float = Field(0.0, ge=0, le=1, description="probability that a label is flipped")
    skip_below: float | None = Field(None, description="skip the query when both segments' returns are below this")
    equal_within: float = Field(0.0, ge=0, description="label 'equal' when the returns differ by less than this")
    gamma: float = Field(1.0, gt=0, le=1, description="myopia: step t of an L-step segment weighs gamma^(L-1-t)")


class SegmentAppConfig(Section):
    """Segment-pair labels from the labelling app (control.preferences.labels_from = "app")."""

    labeller: Literal["simulated", "people"] = Field("simulated", description=(
        "who answers: the simulated teacher of [control.preferences.teacher] through the app's HTTP API, or "
        "people at the page (the run prints the URL and a labeller token, and waits)"))
    db: str = Field("", description='labelling database URL or SQLite path; "" = OUT/labels.db')
    wait_s: float = Field(600, gt=0, description="how long to wait for a round's labels before giving up")
    fps: int = Field(10, ge=1, le=60, description="frames per second of the clips")


class SegmentPrefsConfig(Section):
    """The reward learned from preferences over pairs of trajectory segments (control.reward = 'preferences')."""

    segment_len: int = Field(25, ge=1, le=1000, description="environment steps per segment")
    labels: int = Field(400, ge=1, description="label budget over the whole run")
    rounds: int = Field(8, ge=1, description="labelling rounds, spread evenly over the first half of training")
    schedule: Literal["constant", "hyperbolic"] = Field("constant", description=(
        "labels per round: equal shares, or shares falling as 1 / (1 + round) (more labels early)"))
    selection: Literal["disagreement", "random"] = Field("disagreement", description=(
        "which candidate pairs are labelled: the ensemble's largest disagreement, or at random"))
    pool: int = Field(4, ge=1, le=64, description="candidate pairs per label wanted (disagreement picks from them)")
    ensemble: int = Field(3, ge=1, le=16, description="reward models in the ensemble (differently initialised)")
    epochs: int = Field(100, ge=1, description="full-batch optimizer steps on all labels after each round")
    lr: float = Field(3e-3, gt=0, le=1, description="Adam learning rate of the reward models")
    hidden: int = Field(64, ge=1, le=4096, description="hidden width of each reward model")
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    labels_from: Literal["teacher", "app"] = Field("teacher", description=(
        "who labels: the simulated teacher in process, or the labelling app (segment-pair items with two clips; "
        "[control.preferences.app]), as the online reward-model loop does"))
    app: SegmentAppConfig = Field(default_factory=SegmentAppConfig)

    @model_validator(mode="after")
    def _app_needs_the_app(self) -> SegmentPrefsConfig:
        if self.labels_from != "app" and self.app != SegmentAppConfig():  # (a saved config holds the defaults)
            raise ValueError("[control.preferences.app] configures labels from the labelling app: set "
                             "control.preferences.labels_from = 'app', or remove the section")
        return self


ASSIST_TAKEOVER_FIELDS = ("takeover", "takeover_bc_steps", "takeover_penalty")


class ControlAssistConfig(Section):
    """A simulated expert in the loop (control/assist.py): behaviour cloning on its noisy demonstrations as a warm
    start, then either (mode = "takeover") PPO while it takes over where it judges the agent about to fail, each
    update followed by behaviour cloning on the demonstrations and every takeover so far (HG-DAgger's aggregated
    intervention data), or (mode = "dagger") DAgger rounds: the agent rolls out on its own, the expert labels every
    state it visited, and the policy is cloned on all labels so far."""

    mode: Literal["takeover", "dagger"] = Field("takeover", description=(
        "what follows the warm start for algo.steps rounds of control.num_envs x control.rollout_steps steps: PPO "
        "with the expert's takeovers, or DAgger (no PPO: every visited state labelled by the expert, then "
        "dagger_steps of behaviour cloning on all labels so far)"))
    dagger_steps: int = Field(50, ge=1, le=100_000, description=(
        "mode = 'dagger': full-batch behaviour cloning steps after each round, on the demonstrations and every "
        "labelled state so far (continuing from the policy as it is)"))
    demo_steps: int = Field(80, ge=0, description="environment steps of noisy expert demonstrations (all "
                            "environments together); 0 = none, no warm start")
    demo_noise: float = Field(0.3, ge=0, le=1, description="probability that a demonstrated action is replaced by a "
                              "random one (the executed action is recorded, as a person's slips would be)")
    bc_steps: int = Field(300, ge=0, description="full-batch optimizer steps of behaviour cloning on the "
                          "demonstrations before PPO (the warm start)")
    bc_lr: float = Field(1e-3, gt=0, le=1, description="Adam learning rate of behaviour cloning (warm start and "
                         "after each update)")
    takeover: bool = Field(True, description="the expert executes its own action where it judges the state about "
                           "to fail (false: PPO after the warm start, the expert only demonstrates)")
    takeover_bc_steps: int = Field(50, ge=0, description="full-batch behaviour cloning steps after each update, on "
                                   "the demonstrations and every taken-over state so far (the expert's action)")
    takeover_penalty: float = Field(1.0, ge=0, allow_inf_nan=False, description=(
        "subtracted from the reward PPO sees at every taken-over step (an intervention cost)"))

    @model_validator(mode="after")
    def _one_mode(self) -> ControlAssistConfig:
        given = [k for k in ASSIST_TAKEOVER_FIELDS if k in self.model_fields_set]
        if self.mode == "dagger" and given:
            raise ValueError(f"control.assist.{given[0]} is a setting of the takeover mode; mode = 'dagger' has no "
                             f"takeovers (the expert labels every visited state): remove "
                             f"{', '.join(f'control.assist.{k}' for k in given)}")
        if self.mode == "takeover" and "dagger_steps" in self.model_fields_set:
            raise ValueError("control.assist.dagger_steps is a setting of DAgger rounds: set control.assist.mode = "
                             "'dagger', or remove it")
        return self


class ControlConfig(Section):
    """A control task: a gymnasium environment stepped in parallel copies, and the signal the policy learns from."""

    env: str = Field("CartPole-v1", description="gymnasium environment id (vector observations)")
    env_options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of gymnasium.make")
    num_envs: int = Field(8, ge=1, le=1024, description="environments stepped in parallel (gymnasium.vector)")
    rollout_steps: int = Field(128, ge=1, description="steps per environment per training step")
    hidden: int = Field(64, ge=1, le=4096, description="hidden width of the actor and critic MLPs")
    eval_episodes: int = Field(10, ge=1, le=10_000, description="greedy held-out episodes before and after training")
    reward: Literal["env", "preferences"] = Field("env", description=(
        "what PPO maximises: the environment's reward, or a reward learned from segment preferences"))
    cost: str = Field("", description='cost signal (control/envs.py COSTS: "cart_off_centre", "collision"); "" = none')
    preferences: SegmentPrefsConfig = Field(default_factory=SegmentPrefsConfig)
    assist: ControlAssistConfig | None = Field(None, description=(
        "[control.assist]: the environment's simulated expert's demonstrations, then its takeovers beside PPO or "
        "DAgger rounds"))


# One config class per algorithm, told apart by `name`; the run path looks the name up in
# `feedbackrl.train.run.ALGORITHMS`. A new algorithm adds its class here.
ALGO_CONFIGS = (GRPOConfig, RLOOConfig, PPOConfig, DPOConfig, RewardModelConfig, OnlineRewardModelConfig, SFTOnlyConfig,
                ControlPPOConfig)
AlgoConfig = Annotated[Union[ALGO_CONFIGS], Field(discriminator="name")]  # noqa: UP007 (a union built from a tuple)
ALGO_NAMES = tuple(c.model_fields["name"].default for c in ALGO_CONFIGS)
ONLINE_ALGOS = ("grpo", "rloo", "ppo")


class RewardConfig(Section):
    """The reward of online RL: the task's verifier unless `source` names a reward source (or a composition
    of them, docs/rewards.md) whose options sit beside it; `model = DIR` is short for a learned reward."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)  # a source's options; checked below
    model: str = Field("", description='a reward model dir (from a reward_model run); short for source="learned"')
    source: str = Field("", description='reward source name, see docs/rewards.md; "" = the task\'s verifier')

    @model_validator(mode="after")
    def _check_sources(self) -> RewardConfig:
        from feedbackrl.rewards.registry import check_reward  # here: rewards builds on this module

        check_reward(self)
        return self


class CostConfig(RewardConfig):
    """The cost of online RL, beside its reward: reward sources named exactly as in `[reward]` (a source's
    score is the completion's cost: a regex that matches, an instruction check that passes, a composition),
    or `model = DIR`, a cost model from a reward_model run with algo.kind = "cost" (its calibrated cost).
    Lower is safer. Logged as cost/mean; with `[constraint]` kept under a threshold (docs/safety.md)."""

    model: str = Field("", description='a cost model dir (a reward_model run with algo.kind = "cost"); its '
                       "calibrated cost is the score")
    source: str = Field("", description="cost source name, a reward source as in [reward] whose score is the cost")

    @model_validator(mode="after")
    def _check_sources(self) -> CostConfig:
        from feedbackrl.rewards.registry import check_reward  # here: rewards builds on this module

        check_reward(self, "cost")
        if not (self.model or self.source):
            raise ValueError("cost: name a cost source (cost.source = ..., as in [reward]) or a cost model "
                             "(cost.model = DIR); an empty [cost] section measures nothing")
        if self.source == "cost":
            raise ValueError("cost.source = 'cost' turns a cost model into a reward (1 - cost); in [cost] give the "
                             "cost model as cost.model = DIR, whose score is the cost itself")
        return self


class ConstraintConfig(Section):
    """Keep the expected cost (`[cost]`) under `threshold` with a Lagrange multiplier (Safe RLHF; docs/safety.md):
    each step's advantages are (A_r - lambda A_c) / (1 + lambda), lambda updated once per step from the costs."""

    threshold: float = Field(..., ge=0, allow_inf_nan=False, description=(
        "d: the most mean cost per completion allowed (the cost's own units; J_C <= d)"))
    margin: float = Field(0.0, ge=0, allow_inf_nan=False, description=(
        "the multiplier aims the mean cost at threshold - margin: room for the release test's upper bound, "
        "which sits above the mean ([release]; HC-RLHF's pessimism, as a fixed margin)"))
    multiplier: Literal["lagrangian", "pid"] = Field("lagrangian", description=(
        "lagrangian: gradient ascent on log lambda (lr); pid: Stooke et al.'s PID on the violation (kp, ki, kd)"))
    lr: float = Field(0.1, gt=0, allow_inf_nan=False, description="lagrangian: the step size on log lambda")
    init: float = Field(1.0, ge=0, allow_inf_nan=False, description="lambda at the start (> 0 for lagrangian)")
    cap: float = Field(5.0, gt=0, allow_inf_nan=False, description="lambda_max: lambda never exceeds it")
    window: int = Field(128, ge=1, description="J_C is the mean cost of the last `window` completions")
    delay: int = Field(0, ge=0, description="steps whose costs fill the window before lambda first moves")
    kp: float = Field(0.0, ge=0, allow_inf_nan=False, description="pid: proportional gain on J_C - d")
    ki: float = Field(0.1, ge=0, allow_inf_nan=False, description="pid: integral gain")
    kd: float = Field(0.0, ge=0, allow_inf_nan=False, description="pid: derivative gain (on a rising J_C)")
    bound_delta: float = Field(0.0, ge=0, le=0.5, allow_inf_nan=False, description=(
        "0: J_C is the window's mean cost; in (0, 0.5]: its one-sided Student-t upper bound at this level "
        "(HC-RLHF's pessimism in the multiplier's update; needs window >= 2)"))
    bound_per_prompt: bool = Field(False, description=(
        "with bound_delta > 0: bound the mean of the window's per-prompt mean costs (n = window / "
        "rollout.group_size) instead of its completions, whose costs within one prompt's group are not "
        "independent; window must be a multiple of rollout.group_size"))
    probe_prompts: int = Field(0, ge=0, description=(
        "0: the multiplier steps on the training batch's costs; N > 0: on N probe prompts drawn once at the start "
        "(from the training distribution seeded by train.seed, or the held-out one: probe_from; never trained on), "
        "sampled with the current policy (one completion each, no gradient) and scored by [cost]: J_C is then over "
        "the same prompts at every step, whichever prompts the step drew; window must be a multiple of N"))
    probe_per_step: int = Field(0, ge=0, description=(
        "with probe_prompts: how many of the probe prompts are sampled each step, in a fixed cycle through the "
        "set (the first step samples a whole window); 0 = all of them every step"))
    probe_from: Literal["train", "heldout"] = Field("train", description=(
        "with probe_prompts: where the probe prompts come from. train: N training prompts (Task.sample, seeded by "
        "train.seed); heldout: the N held-out problems after the task.heldout_size ones the evaluation and the "
        "release test use (task.heldout(heldout_size + N)[heldout_size:]): the held-out distribution, disjoint "
        "from the evaluated set and never trained on, the same prompts for every seed"))
    probe_envs: int = Field(0, ge=0, le=10_000, description=(
        "control runs: 0: the multiplier steps on the sampled training rollout's cost; N > 0: on the cost of the "
        "current policy acting greedily (the released policy) on N probe environments of their own (env i seeded "
        "train.seed + 30,000 + i, apart from the training, held-out and benchmark environments), stepped "
        "constraint.probe_steps steps after each rollout, never trained on: each environment's cost per step "
        "over those steps is one entry of the window; window must be a multiple of N"))
    probe_steps: int = Field(0, ge=0, description=(
        "with probe_envs: the steps each probe environment takes per update (episodes go on across updates)"))

    @model_validator(mode="after")
    def _settings_of_its_multiplier(self) -> ConstraintConfig:
        other = {"lagrangian": ("kp", "ki", "kd"), "pid": ("lr",)}[self.multiplier]
        stray = sorted(set(other) & self.model_fields_set)
        if stray:
            raise ValueError(f"constraint.{stray[0]} is a setting of the other multiplier; constraint.multiplier = "
                             f"{self.multiplier!r} does not use {', '.join(stray)}: remove it or change the multiplier")
        if self.multiplier == "lagrangian" and not self.init > 0:
            raise ValueError(f"constraint.init must be > 0 with multiplier = 'lagrangian' (lambda = exp(log lambda)), "
                             f"got {self.init}")
        if self.margin > self.threshold:
            raise ValueError(f"constraint.margin = {self.margin} is above constraint.threshold = {self.threshold}: "
                             "the multiplier would aim at a negative cost")
        if self.init > self.cap:
            raise ValueError(f"constraint.init = {self.init} is above constraint.cap = {self.cap}")
        if self.bound_delta > 0 and self.window < 2:
            raise ValueError(f"constraint.bound_delta = {self.bound_delta} bounds the mean of the window's costs: "
                             f"constraint.window must be >= 2, got {self.window}")
        if self.bound_per_prompt and self.bound_delta == 0:
            raise ValueError("constraint.bound_per_prompt sets what the upper bound is over, and "
                             "constraint.bound_delta = 0 uses no bound: set bound_delta in (0, 0.5] or remove it")
        if self.probe_per_step and not self.probe_prompts:
            raise ValueError(f"constraint.probe_per_step = {self.probe_per_step} samples probe prompts, and "
                             "constraint.probe_prompts = 0 draws none: set probe_prompts or remove probe_per_step")
        if self.probe_from != "train" and not self.probe_prompts:
            raise ValueError(f"constraint.probe_from = {self.probe_from!r} says where the probe prompts come from, and "
                             "constraint.probe_prompts = 0 draws none: set probe_prompts or remove probe_from")
        if self.probe_per_step > self.probe_prompts:
            raise ValueError(f"constraint.probe_per_step = {self.probe_per_step} is more than the "
                             f"constraint.probe_prompts = {self.probe_prompts} there are")
        if self.probe_prompts and self.window % self.probe_prompts:
            raise ValueError(f"constraint.window = {self.window} must be a multiple of constraint.probe_prompts = "
                             f"{self.probe_prompts}: with probe prompts J_C is over the latest window costs of the "
                             "probe set, which holds every probe prompt equally often only then")
        if self.probe_prompts and self.bound_per_prompt:
            raise ValueError("constraint.bound_per_prompt groups the training batch's costs by prompt, and "
                             "constraint.probe_prompts replaces them (one completion per probe prompt, already one "
                             "cost per prompt): remove one of them")
        if self.probe_steps and not self.probe_envs:
            raise ValueError(f"constraint.probe_steps = {self.probe_steps} steps probe environments, and "
                             "constraint.probe_envs = 0 makes none: set probe_envs or remove probe_steps")
        if self.probe_envs and not self.probe_steps:
            raise ValueError(f"constraint.probe_envs = {self.probe_envs} needs constraint.probe_steps >= 1: the "
                             "steps each probe environment takes per update")
        if self.probe_envs and self.window % self.probe_envs:
            raise ValueError(f"constraint.window = {self.window} must be a multiple of constraint.probe_envs = "
                             f"{self.probe_envs}: each update adds one cost per probe environment, and the window "
                             "then holds whole updates")
        if self.probe_envs and self.probe_prompts:
            raise ValueError("constraint.probe_envs (control runs) and constraint.probe_prompts (text runs) each "
                             "replace the training batch's costs: a run uses at most one of them")
        return self


class ReleaseConfig(Section):
    """After training: HC-RLHF's release test on the held-out costs (safety_eval.jsonl), into report.json."""

    delta: float = Field(..., gt=0, le=0.5, description=(
        "released only when the (1 - delta) Student-t upper bound on the mean held-out cost is under "
        "constraint.threshold"))


class PrefsConfig(Section):
    path: str = Field("", description='JSONL/Parquet pairs or rankings; "" = sample the policy, simulated labeller')
    db: str = Field("", description='labelling database URL (sqlite:///labels.db, postgresql://...) to read pairs from')
    project: str = Field("", description="the labelling project whose labels prefs.db pairs come from")
    prompts: int = Field(2000, ge=1, description="training prompts to sample and label")
    heldout_prompts: int = Field(400, ge=1, description="held-out prompts labelled for evaluation")
    responses: int = Field(2, ge=2, le=16, description="responses per prompt: 2 = pairs, more = rankings (loss pro)")
    temperature: float = Field(0.05, ge=0, description="labeller noise: P(a > b) = sigmoid((gold_a - gold_b) / T)")


class OnlineConfig(Section):
    selection: Literal["runner_up", "contrast", "widest", "top", "committee", "bald", "active", "random",
                       "mixed"] = Field(
        "random", description="how pairs are chosen (docs/human_feedback.md): random prompts and the reward "
        "model's best candidate against its runner-up (runner_up) or the pair it scores furthest apart "
        "(contrast); the prompts where that gap is widest (widest) or whose best "
        "candidate scores highest (top); most "
        "informative by committee disagreement (committee) or under a Laplace posterior of the head (bald); "
        "least certain (active); random; half active (mixed)")
    committee: int = Field(4, ge=2, le=16, description="committee: reward models trained per round (1 + resamples)")
    prior_precision: float = Field(1.0, gt=0, description="bald: precision of the Gaussian prior on the reward head")
    labels: int = Field(600, ge=1, description="label budget: the run stops after this many labels")
    retrain_every: int = Field(100, ge=1, description="N: labels per round; the reward model retrains after each")
    candidates: int = Field(4, ge=2, le=16, description="K: distinct responses sampled per prompt")
    pool: int = Field(4, ge=1, le=64, description="prompts sampled per label wanted (active keeps the least sure)")
    heldout_prompts: int = Field(1000, ge=1, description="held-out prompts, one pair each, labelled once")
    temperature: float = Field(0.05, ge=0, description="labeller noise: P(a > b) = sigmoid((gold_a - gold_b) / T)")
    tie_margin: float | None = Field(
        None, ge=0, description="the labeller answers 'tie' when the two gold scores are within this margin (ties "
        "train nothing and held-out ties are dropped); none = it always picks a side")
    train_on_ties: bool = Field(False, description="fetch the labeller's ties too and train them with target 1/2 "
                                "(off: a tie is a label spent that trains nothing; on measured lower held-out "
                                "accuracy, docs/human_feedback.md)")
    gold: Literal["task", "verifier"] = Field(
        "task", description="the simulated labeller's hidden gold: the task's graded score (reverse: partial credit "
        "for near misses) or its verifier's pass/fail (a labeller who only asks 'is it right?')")
    db: str = Field("", description='labelling database URL or SQLite path; "" = OUT/labels.db')
    wait_s: float = Field(600, gt=0, description="how long to wait for a round's labels before giving up")


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="evaluate every N training steps; 0 = only before/after")
    pass_k: int = Field(4, ge=0, le=256, description=(
        "k for pass@k (sampled at the rollout temperature); 0 = greedy accuracy only"))
    batch_size: int = Field(256, ge=1, description="prompts per generation batch in eval")
    warn_truncated: float = Field(0.1, ge=0, le=1, description="warn when more greedy answers than this are cut off")


class TrainConfig(Section):
    seed: int = Field(0, description="seed for data order and sampling")
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 = all cores")
    checkpoint_every: int = Field(0, ge=0, description="save a checkpoint every N steps; 0 = only at the end")
    tensorboard: bool = Field(False, description="also log to TensorBoard (needs the tensorboard extra)")
    device: str = Field("cpu", pattern=r"^(cpu|auto|cuda(:\d+)?)$", description=(
        "where the policy trains and generates: 'cpu', 'cuda', 'cuda:N', or 'auto' (a GPU when torch sees one); "
        "grpo and rloo so far; the other algorithms run on the CPU"))
    precision: Literal["fp32", "bf16"] = Field("fp32", description=(
        "training forward/backward precision: bf16 = autocast with float32 master weights and optimizer "
        "(needs a CPU or GPU with bf16 support); generation stays float32"))
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward (less memory)")
    save_optimizer: bool = Field(True, description=(
        "keep the optimizer state in checkpoints (exact resume); false = smaller checkpoints, a fresh optimizer "
        "on resume"))
    micro_batch_size: int = Field(0, ge=0, description=(
        "online RL: completions per training forward/backward; each minibatch's gradient is accumulated over "
        "chunks this size (the same gradient up to float rounding, less activation memory); 0 = the whole "
        "minibatch at once"))
    skip_zero_advantage: bool = Field(False, description=(
        "grpo and rloo, one process: completions whose advantage is 0 (a group all right or all wrong) skip the "
        "training forward and backward while algo.kl_coef is 0 (nothing else in their loss has a gradient): the "
        "same gradient up to float rounding, a faster step; a step with none left trains one micro-batch. The "
        "logged loss/policy, entropy/mean and clip_frac are then over the trained completions"))


MonitorAction = Literal["log", "stop", "rollback", "raise_kl"]


class PeopleAuditConfig(Section):
    """People as an audit: the sample goes to an accept/reject project in the labelling app while training runs."""

    enabled: bool = Field(False, description="post each audit sample to the labelling app")
    db: str = Field("", description='the labelling app\'s database; "" = OUT/audit_labels.db, served on loopback')
    project: str = Field("audit", min_length=1, max_length=100, description="the accept/reject project's name")
    overlap: int = Field(1, ge=1, le=8, description="labels per item; >= 2 measures the labellers' agreement")
    simulated: int = Field(0, ge=0, le=8, description=(
        "simulated labellers (the task's hidden gold check, Bradley-Terry noise; data/labeller.py) that label "
        "through the app's API; 0 = people at the page"))
    temperature: float = Field(0.1, ge=0, allow_inf_nan=False, description="the simulated labellers' noise")
    wait_s: float = Field(0, ge=0, le=3600, allow_inf_nan=False, description=(
        "seconds a step waits for its sample's labels; 0 = never wait, log the verdicts on the step they arrive"))


class AuditConfig(Section):
    """Audit channels that stand in for a gold check: a second verifier, a judge, people (monitors/audit.py)."""

    every: int = Field(0, ge=0, description="audit a sample every N steps (and at step 1); 0 = no audit")
    samples: int = Field(32, ge=1, le=4096, description="completions per audit, spread over the groups")
    sources: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        'audit name -> a reward source as in [reward] (a stricter verifier, a judge): {strict = {source = "..."}}'))
    people: PeopleAuditConfig = Field(default_factory=PeopleAuditConfig)

    @model_validator(mode="after")
    def _check_channels(self) -> AuditConfig:
        channels = [*self.sources, *(["people"] if self.people.enabled else [])]
        if self.every and not channels:
            raise ValueError(f"monitors.audit.every = {self.every} but no audit channel is configured: add "
                             "monitors.audit.sources.NAME = {source = ...} or monitors.audit.people.enabled = true")
        if channels and not self.every:
            raise ValueError(f"monitors.audit: channel(s) {channels} configured but monitors.audit.every = 0, so they "
                             "would never run: set every = N")
        if "people" in self.sources and self.people.enabled:
            raise ValueError("monitors.audit.sources.people: the name 'people' is the labelling-app channel's")
        for name, node in self.sources.items():
            if not isinstance(node, dict) or not node.get("source") and not node.get("model"):
                raise ValueError(f"monitors.audit.sources.{name}: give a reward source as in [reward], e.g. "
                                 f"{{source = 'judge', ...}} or {{model = DIR}}; got {node!r}")
            from feedbackrl.rewards.registry import check_reward  # here: rewards builds on this module

            check_reward(RewardConfig.model_construct(**node), f"monitors.audit.sources.{name}")
        if self.people.simulated and self.people.simulated < self.people.overlap:
            raise ValueError(f"monitors.audit.people.overlap = {self.people.overlap} labels per item needs at least "
                             f"that many labellers; simulated = {self.people.simulated}")
        return self


class MonitorsConfig(Section):
    """The reward-hacking and health monitors (`feedbackrl.monitors`) run after every on-policy step."""

    enabled: bool = Field(True, description="run the monitors after each step (alerts, samples.jsonl)")
    detectors: list[str] = Field(default_factory=lambda: ["all"], description=(
        'detector names to run (see `feedbackrl.monitors.registry`); ["all"] = every one'))
    actions: dict[str, MonitorAction] = Field(default_factory=dict, description=(
        "detector name -> log | stop | rollback | raise_kl; unlisted detectors only log"))
    options: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "detector name -> its threshold and window settings, e.g. {length_gaming = {growth_min = 0.3}}"))
    samples_per_step: int = Field(8, ge=0, le=1024, description="completions per step written to samples.jsonl")
    gold_every: int = Field(0, ge=0, description="score a sample with the gold check every N steps; 0 = never")
    gold_samples: int = Field(32, ge=1, description="completions per gold check (spread over the groups)")
    audit: AuditConfig = Field(default_factory=AuditConfig)
    reference: bool = Field(False, description=(
        "keep a frozen copy of the starting policy so kl/mean (KL to it) is logged even when algo.kl_coef = 0; "
        "the kl_per_reward detector reads it"))
    kl_raise: float = Field(2.0, gt=1, description="raise_kl multiplies algo.kl_coef by this")
    kl_floor: float = Field(0.05, gt=0, description="raise_kl sets algo.kl_coef at least this (from 0)")
    max_rollbacks: int = Field(2, ge=0, description="rollbacks allowed per run; past it a rollback stops the run")


class ScaleConfig(Section):
    """Beyond one process: Ray rollout and reward workers, asynchronous RL. The defaults are one process."""

    ray_address: str = Field("", description='Ray cluster to join ("auto": the running one); "" starts a local one')
    rollout_workers: int = Field(0, ge=0, le=1024, description="Ray actors that generate rollouts; 0 = the learner")
    reward_workers: int = Field(0, ge=0, le=1024, description="Ray actors that verify completions; 0 = the learner")
    max_staleness: int = Field(0, ge=0, le=1, description=(
        "0: synchronous; 1: the next batch is sampled while the learner trains (one policy version old)"))
    importance_cap: float = Field(2.0, gt=0, description="truncation of the stale samples' importance weights")
    learner: Literal["ddp", "fsdp"] = Field("ddp", description=(
        "under torchrun: 'ddp' keeps the whole policy on every rank; 'fsdp' shards it over the ranks (FSDP2)"))
    weight_sync: Literal["object_store", "collective"] = Field("object_store", description=(
        "how the learner's weights reach the rollout workers after each update: Ray's object store, or a "
        "torch.distributed broadcast in a process group of the learner and the workers (gloo on CPU)"))
    dist_timeout_s: float = Field(0, ge=0, allow_inf_nan=False, description=(
        "under torchrun: seconds a rank waits in a collective before the run fails, e.g. while rank 0 alone "
        "scores with a judge, evaluates or writes a checkpoint; 0 = torch's default (30 min for gloo, "
        "10 min for NCCL)"))

    @property
    def uses_ray(self) -> bool:
        return self.rollout_workers > 0 or self.reward_workers > 0

    @model_validator(mode="after")
    def _async_needs_workers(self) -> ScaleConfig:
        if self.max_staleness > 0 and self.rollout_workers == 0:
            raise ValueError(f"scale.max_staleness={self.max_staleness} needs scale.rollout_workers >= 1 "
                             "(asynchronous sampling happens on the workers)")
        if self.weight_sync == "collective" and self.rollout_workers == 0:
            raise ValueError("scale.weight_sync='collective' needs scale.rollout_workers >= 1 (the weights are "
                             "broadcast to the rollout workers); got 0")
        return self


# what a control run (`[control]`) has no use for: given in its recipe, they are refused rather than ignored
LANGUAGE_MODEL_SECTIONS = ("model", "lora", "task", "sft", "rollout", "reward", "release", "prefs", "online",
                           "scale")


class RunConfig(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=GRPOConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    cost: CostConfig | None = None
    constraint: ConstraintConfig | None = None
    release: ReleaseConfig | None = None
    prefs: PrefsConfig = Field(default_factory=PrefsConfig)
    online: OnlineConfig = Field(default_factory=OnlineConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    monitors: MonitorsConfig = Field(default_factory=MonitorsConfig)
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    control: ControlConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_algo(cls, data: Any) -> Any:
        # an [algo] section without a name is GRPO, as it was before there were other algorithms
        if isinstance(data, dict) and isinstance(data.get("algo"), dict) and "name" not in data["algo"]:
            data = {**data, "algo": {"name": "grpo", **data["algo"]}}
        return data

    def _check_audits(self) -> None:
        """An audit that is the training reward itself passes every hack the reward pays for: refused."""
        train = self.reward.model_dump(exclude_defaults=True)
        train = train or {"source": "task"}
        for name, node in self.monitors.audit.sources.items():
            if {k: v for k, v in node.items() if k != "weight"} == train:
                raise ValueError(f"monitors.audit.sources.{name} is the training reward itself ({train}); an audit "
                                 "must be another check (a stricter verifier, a judge, people)")

    @property
    def minibatch_rows(self) -> int:
        """Rows in one minibatch of an online algorithm: rollout.prompts_per_step * rollout.group_size /
        algo.minibatches."""
        return self.rollout.prompts_per_step * self.rollout.group_size // self.algo.minibatches

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        a, n = self.algo, self.rollout.prompts_per_step * self.rollout.group_size
        if a.name in ONLINE_ALGOS and n % a.minibatches:
            raise ValueError(f"algo.minibatches={a.minibatches} must divide prompts_per_step*group_size={n}")
        # which on-policy algorithm runs with Ray workers, vLLM, torchrun or [constraint] is its objective's
        # `capabilities` (train/onpolicy.py), checked by the run path before any work
        if self.scale.uses_ray and a.name not in ONLINE_ALGOS:
            raise ValueError(f"scale.rollout_workers / scale.reward_workers sample the rollouts of online RL "
                             f"({', '.join(ONLINE_ALGOS)}), not algo.name = {a.name!r}")
        if self.rollout.backend == "vllm" and a.name not in ONLINE_ALGOS:
            raise ValueError(f"rollout.backend = 'vllm' samples the rollouts of online RL ({', '.join(ONLINE_ALGOS)}), "
                             f"not algo.name = {a.name!r}; use rollout.backend = 'native'")
        if self.rollout.weights != "fp32" and (a.name not in ("grpo", "rloo") or self.rollout.backend != "native"
                                               or self.scale.uses_ray):
            raise ValueError(f"rollout.weights = {self.rollout.weights!r} samples the rollouts of grpo and rloo with "
                             "the native decoder in one process so far, not algo.name = "
                             f"{a.name!r}, rollout.backend = {self.rollout.backend!r}, "
                             f"scale.rollout_workers = {self.scale.rollout_workers}, scale.reward_workers = "
                             f"{self.scale.reward_workers}; use rollout.weights = 'fp32'")
        if self.rollout.backend == "vllm" and self.scale.uses_ray:
            raise ValueError(f"rollout.backend = 'vllm' runs without Ray workers so far: set scale.rollout_workers = 0 "
                             f"and scale.reward_workers = 0 (got {self.scale.rollout_workers} and "
                             f"{self.scale.reward_workers})")
        rollbacks = [d for d, action in self.monitors.actions.items() if action == "rollback"]
        if rollbacks and self.monitors.enabled and not self.train.save_optimizer:
            raise ValueError(f"monitors.actions: {rollbacks[0]} = 'rollback' restores the optimizer state of the last "
                             "checkpoint, which train.save_optimizer = false leaves out: set train.save_optimizer = "
                             "true, or another action")
        self._check_audits()
        if self.scale.learner == "fsdp":
            self._check_sharded_learner()
        if a.name == "grpo" and a.scale_advantages and self.rollout.group_size < 2:
            raise ValueError("rollout.group_size must be >= 2 for group-normalised advantages")
        if a.name == "rloo" and self.rollout.group_size < 2:
            raise ValueError("rollout.group_size must be >= 2 for rloo (the baseline needs another sample)")
        if a.name == "dpo" and a.batch_size % a.grad_accum:
            raise ValueError(f"algo.grad_accum={a.grad_accum} must divide algo.batch_size={a.batch_size}")
        if a.name == "dpo" and (a.loss == "pro") != (self.prefs.responses > 2):
            need = "> 2 (rankings)" if a.loss == "pro" else "= 2 (pairs)"
            raise ValueError(f"algo.loss={a.loss!r} needs prefs.responses {need}; got {self.prefs.responses}")
        p = self.prefs
        if bool(p.db) != bool(p.project) or (p.db and p.path):
            raise ValueError(f"prefs.db and prefs.project go together, instead of prefs.path; got db={p.db!r}, "
                             f"project={p.project!r}, path={p.path!r}")
        if p.db and p.responses != 2:
            raise ValueError(f"prefs.db gives pairs: prefs.responses must be 2, got {p.responses}")
        if a.name == "reward_model" and self.prefs.responses != 2:
            raise ValueError(f"the reward model trains on pairs: prefs.responses must be 2, got {self.prefs.responses}")
        if a.name == "sft" and not self.sft.steps:
            raise ValueError("algo.name = 'sft' trains sft.steps steps on the task's demonstrations: set sft.steps > 0")
        if a.name == "online_reward_model" and a.kind != "reward":
            raise ValueError("algo.kind must be 'reward' for online_reward_model: the loop learns what the labeller "
                             "prefers")
        if (self.reward.model or self.reward.source) and a.name not in ONLINE_ALGOS:
            raise ValueError(f"[reward] is the reward of online RL ({', '.join(ONLINE_ALGOS)}); "
                             f"algo.name={a.name!r} does not use it")
        self._check_control()
        self._check_safety()
        return self

    def _check_control(self) -> None:
        """`algo.name = "control_ppo"` and `[control]` go together; the rollout splits into the minibatches."""
        a, c = self.algo, self.control
        if (a.name == "control_ppo") != (c is not None):
            raise ValueError("algo.name = 'control_ppo' trains a control policy described by a [control] section: "
                             f"give both or neither (algo.name = {a.name!r}, [control] "
                             f"{'present' if c is not None else 'missing'})")
        if c is None:
            return
        n = c.num_envs * c.rollout_steps
        dagger = c.assist is not None and c.assist.mode == "dagger"  # no PPO, no minibatches
        if n % a.minibatches and not dagger:
            raise ValueError(f"algo.minibatches={a.minibatches} must divide control.num_envs * control.rollout_steps"
                             f" = {n}")
        if self.cost is not None:
            raise ValueError("[cost] names a scorer of text completions; a control run's cost is control.cost")
        stray_eval = sorted(self.eval.model_fields_set - {"every"})
        if stray_eval:
            raise ValueError(f"eval.{stray_eval[0]} is a setting of language-model evaluation; a control run uses "
                             "eval.every and control.eval_episodes only")
        given = [k for k in LANGUAGE_MODEL_SECTIONS if k in self.model_fields_set]
        if given:
            raise ValueError(f"[{given[0]}] is a section of language-model runs, which a control run (algo.name = "
                             f"'control_ppo') does not use: remove {', '.join(f'[{k}]' for k in given)}")
        if self.constraint is not None and not c.cost:
            raise ValueError("[constraint] keeps control.cost under constraint.threshold: set control.cost")
        m = self.monitors
        refused = {d: x for d, x in m.actions.items() if x == "raise_kl"}
        if refused:
            raise ValueError(f"monitors.actions {refused}: a control run's monitors can log, stop or roll back "
                             "(raise_kl raises a KL coefficient, and control PPO has no KL term)")
        if m.gold_every or m.audit.every:
            raise ValueError("monitors.gold_every and monitors.audit check text completions; a control run's gold "
                             "is the environment's return, compared with the learned reward at every step")
        if c.assist is not None:
            self._check_assist()
        if c.reward == "preferences" and c.preferences.segment_len > c.rollout_steps:
            raise ValueError(f"control.preferences.segment_len = {c.preferences.segment_len} is longer than a "
                             f"rollout (control.rollout_steps = {c.rollout_steps}), where segments are cut from")

    def _check_assist(self) -> None:
        """[control.assist] runs PPO on the environment's reward beside the expert: what it does not combine with."""
        c = self.control
        if c.reward != "env":
            raise ValueError("[control.assist] trains on the environment's reward beside the expert's takeovers; "
                             f"control.reward = {c.reward!r} is not supported with it: remove one of them")
        if c.cost or self.constraint is not None:
            raise ValueError("[control.assist] has no cost value head yet: remove control.cost and [constraint], or "
                             "[control.assist]")
        if self.monitors.enabled and "monitors" in self.model_fields_set:
            raise ValueError("[control.assist] logs the takeover rate but runs no monitors yet: remove [monitors]")
        if self.eval.every:
            raise ValueError("[control.assist] evaluates the greedy policy after every update already: remove "
                             "eval.every")
        if c.env_options:
            raise ValueError("[control.assist] makes its environments without options (the simulated expert is "
                             "written for the default ones): remove control.env_options")
        ppo = sorted(self.algo.model_fields_set - {"name", "steps"})
        if c.assist.mode == "dagger" and ppo:
            raise ValueError(f"algo.{ppo[0]} is a PPO setting; control.assist.mode = 'dagger' trains by behaviour "
                             "cloning only (algo.steps rounds; control.assist.bc_lr and dagger_steps): remove "
                             f"{', '.join(f'algo.{k}' for k in ppo)}")

    def _check_safety(self) -> None:
        """[cost], [constraint] and [release]: what each needs, and what does not run them yet."""
        a = self.algo
        if self.cost is not None and a.name not in ONLINE_ALGOS:
            raise ValueError(f"[cost] is a signal of online RL ({', '.join(ONLINE_ALGOS)}); algo.name={a.name!r} "
                             "does not use it")
        if self.constraint is not None and self.cost is None and self.control is None:
            raise ValueError("[constraint] keeps the cost under constraint.threshold: add a [cost] section naming "
                             "the cost source")
        if self.constraint is not None and (self.scale.uses_ray or self.rollout.backend == "vllm"):
            raise ValueError("[constraint] with Ray workers or rollout.backend = 'vllm' is not yet supported: the "
                             "cost is scored in the learner process; set scale.rollout_workers = 0, "
                             "scale.reward_workers = 0 and rollout.backend = 'native'")
        if self.release is not None and self.scale.learner == "fsdp":
            raise ValueError("[release] with scale.learner = 'fsdp': the held-out safety eval runs in one process so "
                             "far; release the last checkpoint with `feedbackrl release` after a run without torchrun")
        if self.release is not None and self.constraint is None:
            raise ValueError("[release] tests the held-out cost against constraint.threshold: add a [constraint] "
                             "section (and its [cost])")
        k, g = self.constraint, self.rollout.group_size
        if k is not None and k.bound_per_prompt and self.control is not None:
            raise ValueError("constraint.bound_per_prompt groups costs by prompt; a control run's costs come from "
                             "environment steps, not prompts: remove it")
        if k is not None and k.probe_prompts and self.control is not None:
            raise ValueError("constraint.probe_prompts samples prompts of the task; a control run's costs come from "
                             "environment steps, not prompts: remove it")
        if k is not None and k.probe_envs and self.control is None:
            raise ValueError("constraint.probe_envs steps greedy probe environments of a control run (algo.name = "
                             "'control_ppo' with [control]); a text run's probe is constraint.probe_prompts: "
                             "remove probe_envs and probe_steps")
        if k is not None and k.probe_prompts and self.scale.learner == "fsdp":
            raise ValueError("constraint.probe_prompts with scale.learner = 'fsdp': the probe prompts are sampled "
                             "in one process so far; remove probe_prompts or run without torchrun")
        if k is not None and k.probe_from == "heldout":
            self._check_heldout_probes()
        if k is not None and k.bound_per_prompt and (k.window % g or k.window // g < 2):
            raise ValueError(f"constraint.bound_per_prompt bounds the window's per-prompt means: constraint.window = "
                             f"{k.window} must be a multiple of rollout.group_size = {g} holding at least 2 prompts")


    def _check_heldout_probes(self) -> None:
        """constraint.probe_from = 'heldout': the task must have a held-out split apart from its training problems."""
        name, options = self.task.name, self.task.options
        no_split = {  # built-in tasks (or their options) whose held-out problems are not a split of their own
            "guess_number": "its held-out games replay the training secrets (heldout(n) cycles 1..hi)",
            "dataset": "task.options.heldout_fraction = 0 holds no rows out"
            if options.get("heldout_fraction", 0.1) == 0 else "",
            "verifiers": "task.options.heldout_tasks = 0 holds no tasks out"
            if not options.get("heldout_tasks", 0) else "",
        }.get(name, "")
        if no_split:
            raise ValueError(f"constraint.probe_from = 'heldout' draws the probe prompts from the task's held-out "
                             f"split, and task {name!r} has none: {no_split}; use probe_from = 'train'")

    def _check_sharded_learner(self) -> None:
        """What `scale.learner = 'fsdp'` does not run (yet): each setting named with its fix."""
        refused = {
            "algo.name": (self.algo.name not in ("grpo", "rloo"),
                          f"is {self.algo.name!r}; the sharded learner trains grpo and rloo"),
            "rollout.backend": (self.rollout.backend != "native", f"is {self.rollout.backend!r}; the ranks "
                                "generate with the native sampler: set 'native'"),
            "scale.rollout_workers / scale.reward_workers": (
                self.scale.uses_ray, "use Ray workers; the ranks generate their own shares: set both to 0"),
            "lora.rank": (self.lora.rank > 0, f"is {self.lora.rank}; LoRA adapters are not sharded: set 0 "
                                              "(full fine-tuning) or use scale.learner = 'ddp'"),
            "sft.steps": (self.sft.steps > 0 and self.algo.name != "sft",
                          f"is {self.sft.steps}; the SFT warm start runs unsharded: train it in its own run "
                          "(algo.name = 'sft') and set model.path to the policy it saves, with sft.steps = 0"),
        }
        bad = [f"{key} {why}" for key, (wrong, why) in refused.items() if wrong]
        if bad:
            raise ValueError("scale.learner = 'fsdp': " + "; ".join(bad))


def _location(loc: tuple[Any, ...]) -> str:
    """('algo', 'dpo', 'beta') -> 'algo.beta': the union's tag is not a key the user wrote."""
    if len(loc) > 1 and loc[0] == "algo" and loc[1] in ALGO_NAMES:
        loc = (loc[0], *loc[2:])
    return ".".join(str(p) for p in loc) or "<root>"


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        loc = _location(e["loc"])
        if e["type"] == "union_tag_invalid":
            lines.append(f"  {loc}.name: unknown algorithm {e['input'].get('name')!r}; choose one of {ALGO_NAMES}")
        elif e["type"] == "union_tag_not_found":
            lines.append(f"  {loc}.name: missing; choose one of {ALGO_NAMES}")
        elif not e["loc"] or (e["type"] == "value_error" and e["msg"].startswith(f"Value error, {loc}")):
            # a cross-field or section check: its message names the fields; the input is the whole section
            lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
        elif e["type"] == "extra_forbidden":
            lines.append(f"  {loc}: unknown key (value {e['input']!r}); check the spelling, "
                         "see `feedbackrl config` for the allowed keys")
        else:
            lines.append(f"  {loc}: {e['msg']} (got {e['input']!r})")
    return "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """'algo.lr=3e-4' -> (['algo', 'lr'], 0.0003). Values are parsed as TOML, else kept as strings."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    key, raw = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        keys, value = parse_override(item)
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {k!r} is a value, not a section")
        node[keys[-1]] = value
    return data


def build_config(data: dict[str, Any], source: str = "recipe") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source)) from None


def read_recipe(path: str | Path | None) -> tuple[dict[str, Any], str]:
    """A TOML recipe as a dict, and its name for error messages; ({}, "defaults") without a path."""
    if path is None:
        return {}, "defaults"
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8")), str(path)
    except UnicodeDecodeError as e:
        raise ConfigError(f"recipe {str(path)!r} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise ConfigError(f"recipe {str(path)!r} cannot be read: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, RecursionError) as e:  # tomllib recurses once per nested array or table
        raise ConfigError(f"recipe {str(path)!r} is not valid TOML: {e or 'nested too deeply'}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a TOML recipe (or start from defaults), apply dotted overrides, validate."""
    data, source = read_recipe(path)
    return build_config(apply_overrides(data, overrides or []), source)
