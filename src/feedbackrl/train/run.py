"""The one run path: `feedbackrl train RECIPE` (and `feedbackrl demo`) for every algorithm.

build or load the policy -> optional SFT warm start -> held-out evaluation -> the algorithm, looked
up by `algo.name` in `ALGORITHMS` -> held-out evaluation again (when it trains the policy) -> the
gold comparison (when the training signal is not the task's own verifier) -> report.json, the
printed summary and curves.png.

Every algorithm gets the same `Run` (`train/context.py`): the policy on its device, the task, the
metrics sink and the recipe's reward as one `Scorer`. Adding an algorithm is its loop in one file
under train/ (pure losses in algos/), its config class in config.py, and one line here; an on-policy
algorithm is an objective of the one loop (`train/onpolicy.py`), registered with `on_policy(Objective)`.

Under `torchrun` (WORLD_SIZE > 1) every rank runs this path as one rank of a data-parallel learner
(`scale/ddp.py`, for the algorithms marked `data_parallel`): rank 0 evaluates and writes everything
below, the other ranks build the same policy and train in step with it. With `scale.learner = "fsdp"`
(`scale/fsdp.py`) the policy is sharded over the ranks and every rank evaluates with rank 0.

`OUT/` after a run: `config.json` (the resolved config), `metrics.jsonl` (one line per step),
`eval_before.json`, `report.json`, `curves.png`; `base_model/` when the model was built locally;
`sft_policy/` after an SFT warm start (reusable as `model.path`); and what the algorithm writes:
`checkpoints/step_N/` (grpo, rloo, ppo; PPO's also hold its value head) and, with a KL term,
`reference.json` (the model directory holding the starting weights) or `reference/` (a copy),
`prefs/*.jsonl` (generated preference data), `reward_model/` (reward_model), `policy/` (dpo),
`labels.db` (online_reward_model).
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from feedbackrl.config import ConfigError, RunConfig
from feedbackrl.data.labeller import gold_score_for
from feedbackrl.data.rows import read_jsonl
from feedbackrl.envs.base import Task
from feedbackrl.envs.registry import make_task
from feedbackrl.episodes.contracts import EvalResult
from feedbackrl.episodes.kinds import check_task_kind, evaluate, task_kind
from feedbackrl.episodes.single_turn import task_scorer
from feedbackrl.log import JsonlSink, MetricsSink, MultiSink, TensorBoardSink, console
from feedbackrl.models.load import ModelLoadError, load_policy, load_tokenizer, resolve_model_path
from feedbackrl.models.policy import setup_policy
from feedbackrl.models.tiny import make_tiny
from feedbackrl.monitors.report import alerts_section
from feedbackrl.rewards.registry import BatchReward
from feedbackrl.scale.ranks import OneProcess, Ranks
from feedbackrl.train.checkpoint import CheckpointError, read_config_json, resolve_resume
from feedbackrl.train.context import Algorithm, Run
from feedbackrl.train.grpo import GroupRelative
from feedbackrl.train.online_labels import run_online_labels
from feedbackrl.train.onpolicy import OnPolicy, check_capabilities
from feedbackrl.train.ppo import PPO
from feedbackrl.train.ppo_lagrangian import PPOLagrangian
from feedbackrl.train.preference import run_dpo, run_reward_model
from feedbackrl.train.prefs import gold_comparison, gold_scorer, training_cost, training_reward
from feedbackrl.train.release import SAFETY_EVAL_FILE, release_run, safety_eval
from feedbackrl.train.report import print_report, write_plot
from feedbackrl.train.sft import run_sft, sft_warmstart

# A whole run for a policy that is not a language model (control/): its own model, environments and evaluation;
# the run path gives it the config, the out dir, the checkpoint to resume and the metrics sink.
WholeRun = Callable[[RunConfig, Path, Path | None, MetricsSink], dict[str, Any]]


def run_control(cfg: RunConfig, out_dir: Path, ckpt: Path | None, sink: MetricsSink) -> dict[str, Any]:
    """`algo.name = "control_ppo"` (control/loop.py); gymnasium, the control extra, is imported only here."""
    try:
        from feedbackrl.control.loop import run_control as run
    except ModuleNotFoundError as e:
        raise ConfigError(f"algo.name = 'control_ppo' needs {e.name}: pip install 'feedbackrl[control]'") from None
    return run(cfg, out_dir, ckpt, sink)


def control_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint of a control run (`path` a checkpoint or a run dir), else None (e.g. a language model)."""
    try:
        ckpt = resolve_resume(path)
    except CheckpointError:
        return None
    return ckpt if read_config_json(ckpt).get("algo", {}).get("name") == "control_ppo" else None


def eval_control(ckpt: Path, video: Path | None, max_steps: int) -> dict[str, Any]:
    """`feedbackrl eval` of a control checkpoint (control/loop.py `eval_checkpoint`)."""
    try:
        from feedbackrl.control.loop import eval_checkpoint
    except ModuleNotFoundError as e:
        raise ConfigError(f"evaluating a control policy needs {e.name}: pip install 'feedbackrl[control]'") from None
    return eval_checkpoint(ckpt, video, max_steps)


@dataclass(frozen=True)
class Entry:
    train: Algorithm | None  # None: `whole_run` does the training
    trains_policy: bool = True  # False: the policy is only the starting point (reward models): no eval after
    resumable: bool = False  # `--resume` continues it from a checkpoint
    off_cpu: bool = False  # runs on `train.device` = cuda
    data_parallel: bool = False  # runs under `torchrun` as a data-parallel learner (`scale/ddp.py`)
    whole_run: WholeRun | None = None


def on_policy(plain: Any, constrained: Any = None) -> Entry:
    """An objective of the on-policy loop (`train/onpolicy.py`); `constrained`: the one a recipe with
    [constraint] gets. Its flags are the objective's own `capabilities` (declared next to it)."""
    algo = OnPolicy(plain, constrained)
    return Entry(algo, resumable=True, off_cpu=plain.capabilities.off_cpu, data_parallel=plain.capabilities.torchrun)


ALGORITHMS: dict[str, Entry] = {
    "grpo": on_policy(GroupRelative),
    "rloo": on_policy(GroupRelative),
    "ppo": on_policy(PPO, constrained=PPOLagrangian),
    "dpo": Entry(run_dpo),
    "reward_model": Entry(run_reward_model, trains_policy=False),
    "online_reward_model": Entry(run_online_labels, trains_policy=False),
    "sft": Entry(run_sft, off_cpu=True),
    "control_ppo": Entry(None, resumable=True, whole_run=run_control),
}


def set_threads(n: int, processes_per_node: int = 1) -> None:
    """`train.threads`, or the cores this process can actually get (CPU affinity, the cgroup's CPU quota)
    shared among `processes_per_node` busy processes: never more threads than cores (oversubscribed
    threads that wait on a descheduled peer made a shared 2-core machine many times slower)."""
    from feedbackrl.scale.threads import threads_per_process  # torch only; no Ray

    torch.set_num_threads(threads_per_process(processes_per_node, requested=n))


def resolve_device(name: str) -> torch.device:
    """`train.device` -> a torch device; 'auto' is the first GPU when torch sees one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device = {name!r} but torch sees no CUDA device (a CPU build of torch, or no GPU "
                          "here); use 'cpu' or 'auto'")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"train.device = {name!r} but torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


def load_or_build(cfg: RunConfig, out_dir: Path,
                  ranks: Ranks | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    path = cfg.model.path
    if path == "tiny":  # built by rank 0, read by every rank
        ranks = ranks or OneProcess()
        path = str(out_dir / "base_model")
        if ranks.main:
            make_tiny(path, cfg.model.size, cfg.model.init_seed)
        ranks.barrier()
    return load_policy(path), load_tokenizer(path)


def start_dir(cfg: RunConfig, out_dir: Path) -> Path | None:
    """A model directory that holds the policy's weights as the algorithm starts (the KL reference), or None:
    the SFT policy the run saved, the tiny model it built, or the local directory it loaded."""
    if cfg.sft.steps and cfg.algo.name != "sft":
        return out_dir / "sft_policy"
    if cfg.model.path == "tiny":
        return out_dir / "base_model"
    try:
        path = Path(resolve_model_path(cfg.model.path))
    except ModelLoadError:
        return None
    return path if (path / "config.json").is_file() else None


def make_sink(cfg: RunConfig, out_dir: Path) -> MetricsSink:
    sinks: list[MetricsSink] = [JsonlSink(out_dir / "metrics.jsonl")]
    if cfg.train.tensorboard:
        sinks.append(TensorBoardSink(out_dir / "tensorboard"))
    return MultiSink(sinks)


def run_eval(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, cfg: RunConfig,
             ranks: Ranks | None = None) -> EvalResult:
    """The held-out evaluation; a sharded policy's ranks all run it, in step (`Ranks.all_done`)."""
    problems = task.heldout(cfg.task.heldout_size)
    return evaluate(model, tokenizer, task, problems, cfg.rollout.max_new_tokens, k=cfg.eval.pass_k,
                    temperature=cfg.rollout.temperature, batch_size=cfg.eval.batch_size,
                    truncated_fails=cfg.rollout.truncated_fails, warn_truncated=cfg.eval.warn_truncated,
                    all_done=(ranks or OneProcess()).all_done)


def model_task(cfg: RunConfig, task: Task, tokenizer: PreTrainedTokenizerBase) -> Task:
    """The task as this model sees it (its kind's `for_model`): single-turn prompts rendered with its chat
    template (`model.chat_template`); multi-turn and external tasks render their own transcripts."""
    return task_kind(task).for_model(task, tokenizer, cfg.model)


def start_run(cfg: RunConfig, out_dir: str | Path, ranks: Ranks | None = None) -> Path:
    """What every run does first: quiet HF bars, make the out dir, set threads, print and save the config
    (rank 0 only under `torchrun`: the other ranks print nothing)."""
    ranks = ranks or OneProcess()
    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = cfg.scale  # asynchronous local workers generate while the learner trains: they share the cores
    busy = 1 + s.rollout_workers if s.max_staleness and not s.ray_address else 1
    set_threads(cfg.train.threads, busy * ranks.local_world)  # torchrun's ranks on this node share its cores too
    console.quiet = not ranks.main
    console.print_json(cfg.model_dump_json())
    if ranks.world > 1:
        console.print(f"data-parallel learner: {ranks.world} ranks ({ranks.backend}), {ranks.local_world} on this "
                      f"node with {torch.get_num_threads()} thread(s) each")
    if ranks.sharded:
        console.print("the policy is sharded over the ranks (FSDP2)")
    if ranks.main:
        (out_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    return out_dir


def _eval_metrics(result: dict[str, Any], k: int) -> dict[str, Any]:
    sampled = {f"eval/pass@{k}": result[f"pass@{k}"]} if k else {}  # eval.pass_k = 0: greedy only
    finished = ({"eval/finished_accuracy": result["finished_accuracy"]}
                if result.get("finished_accuracy") is not None else {})
    return {"phase": "eval", "eval/accuracy": result["accuracy"], **sampled, **finished}


def join_ranks(device: torch.device, learner: str = "ddp", timeout_s: float = 0) -> tuple[Ranks, torch.device]:
    """This process alone, or, launched by `torchrun` (WORLD_SIZE > 1), its rank of the data-parallel learner
    (`scale.learner`: the whole policy on every rank, or sharded with FSDP2) and the device that rank trains on.
    `timeout_s`: the process group's collective timeout (`scale.dist_timeout_s`; 0 = torch's default)."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return OneProcess(), device
    if learner == "fsdp":
        from feedbackrl.scale.fsdp import ShardedRanks  # torch.distributed glue: imported when launched so

        return ShardedRanks.join(device, timeout_s)
    from feedbackrl.scale.ddp import TorchrunRanks

    return TorchrunRanks.join(device, timeout_s)


def check_run(cfg: RunConfig, resume: str | Path | None) -> tuple[Entry, torch.device, Path | None]:
    """Everything that can fail before any work: the algorithm, the device, the checkpoint to resume."""
    entry = ALGORITHMS[cfg.algo.name]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not entry.data_parallel:
        on = [name for name, e in ALGORITHMS.items() if e.data_parallel]
        raise ConfigError(f"torchrun: algo.name = {cfg.algo.name!r} runs in one process so far (data-parallel: "
                          f"{', '.join(on)}); launch it without torchrun")
    if world > 1 and cfg.rollout.backend != "native":
        raise ConfigError(f"torchrun with rollout.backend = {cfg.rollout.backend!r}: the ranks generate their shares "
                          "with the native sampler so far; set rollout.backend = 'native'")
    if world > 1 and cfg.scale.uses_ray:
        raise ConfigError("torchrun with scale.rollout_workers / scale.reward_workers: use one or the other (the "
                          "ranks generate their own shares of each step)")
    if world > 1 and world > cfg.minibatch_rows:
        raise ConfigError(f"torchrun with {world} ranks: a minibatch holds {cfg.minibatch_rows} rows "
                          "(rollout.prompts_per_step * rollout.group_size / algo.minibatches); every rank needs one")
    if isinstance(entry.train, OnPolicy):  # what the objective runs with, declared next to it
        check_capabilities(cfg, cfg.algo.name, entry.train.capabilities(cfg), world)
    if cfg.scale.learner == "fsdp":
        check_sharded(cfg, world)
    device = resolve_device(cfg.train.device)
    if cfg.rollout.backend == "vllm":  # installed, and a device it runs on: checked before any work
        from feedbackrl.scale.vllm_rollout import check_vllm

        check_vllm(device)
    if device.type != "cpu" and not entry.off_cpu:
        on = [name for name, e in ALGORITHMS.items() if e.off_cpu]
        raise ConfigError(f"train.device = {cfg.train.device!r}: algo.name = {cfg.algo.name!r} runs on the CPU only "
                          f"so far (off the CPU: {', '.join(on)})")
    if resume is not None and not entry.resumable:
        can = [name for name, e in ALGORITHMS.items() if e.resumable]
        raise CheckpointError(f"--resume: algo.name = {cfg.algo.name!r} cannot continue from a checkpoint "
                              f"(these can: {', '.join(can)}); start the run again")
    return entry, device, resolve_resume(resume) if resume is not None else None


def check_sharded(cfg: RunConfig, world: int) -> None:
    """`scale.learner = "fsdp"` needs torchrun's ranks, and equal shares of every minibatch: each training
    forward is collective, so every rank must split its share into the same number of micro-batches."""
    if world == 1:
        raise ConfigError("scale.learner = 'fsdp' shards the policy over torchrun's ranks: launch with torchrun "
                          "--nproc_per_node N (N >= 2), or set scale.learner = 'ddp' for one process")
    if cfg.minibatch_rows % world:
        raise ConfigError(f"scale.learner = 'fsdp' with {world} ranks: a minibatch holds {cfg.minibatch_rows} rows "
                          "(rollout.prompts_per_step * rollout.group_size / algo.minibatches), which the ranks "
                          f"cannot share equally; make it a multiple of {world}")


def prepare_policy(cfg: RunConfig, task: Task, out_dir: Path, ckpt: Path | None, device: torch.device,
                   sink: MetricsSink, ranks: Ranks | None = None,
                   ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Task, dict[str, Any] | None]:
    """The policy the algorithm starts from, the task as it sees it, and its held-out evaluation: built or
    loaded, `[lora]` and checkpointing applied, then SFT and evaluated; or, resuming, the checkpoint's
    policy (adapters included) and the evaluation the run saved when it started.

    Under `torchrun` every rank builds (or loads) the policy and runs the SFT warm start, which needs no
    communication; rank 0 alone evaluates and writes, and its weights are then broadcast to the others.
    A sharded learner (`scale.learner = "fsdp"`) shards the policy onto the device instead (every rank has
    loaded the same weights) and every rank evaluates; there is no warm start (the config refuses it)."""
    ranks = ranks or OneProcess()
    check_task_kind(cfg, task, ranks.world, ranks.sharded)  # before the evaluation every rank runs
    if ckpt is not None:
        if read_config_json(ckpt) != json.loads(cfg.model_dump_json()):
            console.print("[yellow]warning: resuming with a config that differs from the checkpoint's")
        model, tokenizer = load_policy(str(ckpt)), load_tokenizer(str(ckpt))
    else:
        model, tokenizer = load_or_build(cfg, out_dir, ranks)
    # [lora], gradient checkpointing, precision; a sharded policy goes to the device shard by shard
    model = ranks.shard(setup_policy(model if ranks.sharded else model.to(device), cfg.lora, cfg.train))
    task = model_task(cfg, task, tokenizer)
    before = None
    if ckpt is not None:
        before_path = out_dir / "eval_before.json"
        before = json.loads(before_path.read_text()) if before_path.exists() else None
    else:
        if cfg.sft.steps and cfg.algo.name != "sft":  # a warm start; with algo.name = "sft" it is the algorithm
            sft_warmstart(model, tokenizer, task, cfg.sft, cfg.train.seed, sink)
            if ranks.main:
                model.save_pretrained(out_dir / "sft_policy")
                tokenizer.save_pretrained(out_dir / "sft_policy")
        if ranks.main or ranks.sharded:
            before = run_eval(model, tokenizer, task, cfg, ranks).to_dict()
        if ranks.main:
            (out_dir / "eval_before.json").write_text(json.dumps(before, indent=2))
            sink.log(0, _eval_metrics(before, cfg.eval.pass_k))
    ranks.sync_parameters(model)
    return model, tokenizer, task, before


def run(cfg: RunConfig, out_dir: str | Path, resume: str | Path | None = None, task: Task | None = None,
        reward: BatchReward | None = None) -> dict[str, Any]:
    """Run the recipe into `out_dir`; with `resume`, continue from a checkpoint (SFT is not redone).

    `task` and `reward` (the Python API, `train/api.py`) replace the task `[task]` names and the reward
    `[reward]` describes with objects built in this process; they run in one process only."""
    entry, device, ckpt = check_run(cfg, resume)
    if task is not None or reward is not None:
        check_in_process(cfg)
    if entry.whole_run is not None:
        return _run_whole(cfg, entry.whole_run, Path(out_dir), ckpt)
    ranks, device = join_ranks(device, cfg.scale.learner, cfg.scale.dist_timeout_s)
    try:
        if not ranks.main:  # the other ranks train in step with rank 0, which evaluates and reports
            _train_on_rank(cfg, entry, out_dir, device, ckpt, ranks)
            return {}
        return _run_main(cfg, entry, out_dir, device, ckpt, ranks, task, reward)
    finally:
        ranks.close()


def _run_whole(cfg: RunConfig, whole_run: WholeRun, out_dir: Path, ckpt: Path | None) -> dict[str, Any]:
    """A whole-run entry, with the run path's config print, sink, report.json, curves.png and summary."""
    t_start = time.perf_counter()
    out_dir = start_run(cfg, out_dir)
    sink = make_sink(cfg, out_dir)
    try:
        report = {"task": cfg.task.name if cfg.control is None else cfg.control.env, "algo": cfg.algo.name,
                  **whole_run(cfg, out_dir, ckpt, sink)}
    finally:
        sink.close()
    report.update(wall_seconds=time.perf_counter() - t_start, resumed_from=str(ckpt) if ckpt else None)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    write_plot(out_dir / "metrics.jsonl", out_dir / "curves.png", f"{report['task']} / {cfg.algo.name}")
    print_report(report)
    return report


def check_in_process(cfg: RunConfig) -> None:
    """A task or reward object lives in this process: no torchrun ranks or Ray workers can rebuild it."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("a task or reward object passed from Python runs in one process: launch without torchrun, "
                          "or name them in the recipe ([task] name, [reward] source = 'python')")
    if cfg.scale.uses_ray:
        raise ConfigError("a task or reward object passed from Python runs in this process: set "
                          "scale.rollout_workers = 0 and scale.reward_workers = 0, or name them in the recipe")


def _train_on_rank(cfg: RunConfig, entry: Entry, out_dir: str | Path, device: torch.device, ckpt: Path | None,
                   ranks: Ranks) -> None:
    """A `torchrun` rank other than 0: the policy, then the algorithm's collectives; it writes nothing. A
    sharded policy's rank also runs rank 0's evaluations with it (their results are rank 0's to write)."""
    out_dir = start_run(cfg, out_dir, ranks)
    sink = MultiSink([])
    model, tokenizer, task, _ = prepare_policy(cfg, make_task(cfg.task), out_dir, ckpt, device, sink, ranks)
    scorer = task_scorer(task)  # never called: rank 0 scores, this rank receives its verdicts
    start = None if ckpt is not None else start_dir(cfg, out_dir)

    def on_eval(step: int) -> dict[str, Any]:
        run_eval(model, tokenizer, task, cfg, ranks)
        return {}  # rank 0 logs the result

    entry.train(Run(cfg, out_dir, model, tokenizer, task, sink, device, scorer, ckpt,
                    on_eval if ranks.sharded else None, start, ranks))
    if ranks.sharded and entry.trains_policy:
        run_eval(model, tokenizer, task, cfg, ranks)


def _run_main(cfg: RunConfig, entry: Entry, out_dir: str | Path, device: torch.device, ckpt: Path | None,
              ranks: Ranks, task: Task | None = None, reward: BatchReward | None = None) -> dict[str, Any]:
    t_start = time.perf_counter()
    out_dir = start_run(cfg, out_dir, ranks)
    task = task if task is not None else make_task(cfg.task)
    check_task_kind(cfg, task, ranks.world, ranks.sharded)  # [cost] needs a kind the recipe's scorers judge
    reward = reward if reward is not None else training_reward(cfg, task)
    cost = training_cost(cfg, task)  # [cost]: the same registry, its score the completion's cost
    proxy = cfg.algo.name == "dpo" or reward != task.verify_batch  # trained on something other than the verifier
    sink = make_sink(cfg, out_dir)
    named = cfg.reward.model or cfg.reward.source or ("verifier" if reward == task.verify_batch else "python")
    report: dict[str, Any] = {"task": cfg.task.name, "algo": cfg.algo.name, "reward": named}
    if ranks.world > 1:
        report["data_parallel_ranks"] = ranks.world
        report["learner"] = cfg.scale.learner
    try:
        model, tokenizer, task, before = prepare_policy(cfg, task, out_dir, ckpt, device, sink, ranks)
        # a sharded policy cannot be deep-copied, and the comparison would have to run on every rank
        baseline = copy.deepcopy(model).eval() if proxy and entry.trains_policy and not ranks.sharded else None

        def on_eval(step: int) -> dict[str, Any]:
            r = run_eval(model, tokenizer, task, cfg, ranks)
            return {k: v for k, v in _eval_metrics(r.to_dict(), r.k).items() if k != "phase"}

        gold = gold_score_for(task) if proxy else None  # the hidden score a proxy-trained policy is judged by
        scorer = gold_scorer(reward, gold, cost)
        t_train = time.perf_counter()
        start = None if ckpt is not None else start_dir(cfg, out_dir)
        report.update(entry.train(Run(cfg, out_dir, model, tokenizer, task, sink, device, scorer, ckpt, on_eval,
                                      start, ranks)))
        report["train_seconds"] = time.perf_counter() - t_train
        report["eval_before"], report["eval_after"] = before, None
        if entry.trains_policy:
            after = run_eval(model, tokenizer, task, cfg, ranks).to_dict()
            # at the algorithm's last step, not a longer SFT warm start's
            last = max((r["step"] for r in read_jsonl(out_dir / "metrics.jsonl") if r.get("phase") != "sft"),
                       default=0)
            sink.log(last, _eval_metrics(after, cfg.eval.pass_k))
            report["eval_after"] = after
        if cost is not None and entry.trains_policy and not ranks.sharded:
            # the held-out cost of the trained policy's completions (the costs file `feedbackrl release` reads)
            report["safety_eval"] = safety_eval(model, tokenizer, task.heldout(cfg.task.heldout_size), cost, reward,
                                                out_dir / SAFETY_EVAL_FILE, cfg.rollout.max_new_tokens,
                                                cfg.rollout.temperature, cfg.train.seed + 3, cfg.eval.batch_size)
        if report.get("prefs", {}).get("gold") is False:  # the user's own pairs: the task's gold says nothing
            baseline = None
            report["no_gold"] = (f"trained on preferences from {report['prefs']['source']} that carry no gold score: "
                                 "no gold comparison with the starting policy; judge it on your own held-out data")
        if ranks.sharded and proxy and gold is not None and entry.trains_policy:
            report["no_gold"] = ("scale.learner = 'fsdp': no gold comparison with the starting policy (a sharded "
                                 "policy is not copied for it); compare the last checkpoint in one process")
        if baseline is not None and gold is not None:
            report["gold_vs_sft"] = gold_comparison(model, baseline, tokenizer, task.heldout(cfg.task.heldout_size),
                                                    gold, cfg.rollout.max_new_tokens, cfg.rollout.temperature)
        report["alerts"] = alerts_section(out_dir)  # the monitors' alerts (none when they are off)
    finally:
        sink.close()
    report.update(wall_seconds=time.perf_counter() - t_start, resumed_from=str(ckpt) if ckpt else None)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    if cfg.release is not None and cfg.constraint is not None and "safety_eval" in report:
        decision, _ = release_run(out_dir, cfg.constraint.threshold, cfg.release.delta)  # merged into report.json
        report["release"] = decision.to_dict()
    write_plot(out_dir / "metrics.jsonl", out_dir / "curves.png", f"{cfg.task.name} / {cfg.algo.name}")
    print_report(report)
    return report
