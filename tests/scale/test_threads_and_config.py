"""Thread budgets from the cores a process may really use: affinity, cgroup v2 quota, workers per node."""

import os

import pytest

from feedbackrl.scale.threads import available_cores, cgroup_cpu_quota, threads_per_process, worker_env


def write_cpu_max(tmp_path, text: str):
    (tmp_path / "cpu.max").write_text(text)
    return tmp_path


def test_cgroup_quota_in_cores(tmp_path):
    assert cgroup_cpu_quota(write_cpu_max(tmp_path, "150000 100000\n")) == 1.5
    assert cgroup_cpu_quota(write_cpu_max(tmp_path, "max 100000\n")) is None  # unlimited
    assert cgroup_cpu_quota(tmp_path / "missing") is None  # no cgroup v2 here


def test_available_cores_is_the_smaller_of_affinity_and_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert available_cores(write_cpu_max(tmp_path, "50000 100000")) == min(affinity, 0.5)
    assert available_cores(write_cpu_max(tmp_path, f"{100000 * (affinity + 4)} 100000")) == affinity
    assert available_cores(tmp_path / "missing") == affinity


@pytest.mark.parametrize(("cores", "workers", "threads"), [
    (2, 1, 2),   # one process owns both cores
    (2, 2, 1),   # two workers: one core each
    (2, 3, 1),   # more workers than cores: never 0 threads
    (8, 3, 2),   # floor(8 / 3)
    (1.5, 1, 1),  # a quota of 1.5 cores: one thread, not two that share 1.5 cores
])
def test_threads_per_process(cores, workers, threads):
    assert threads_per_process(workers, cores=cores) == threads


def test_a_requested_count_wins_and_bad_worker_counts_fail():
    assert threads_per_process(4, requested=3, cores=2) == 3
    with pytest.raises(ValueError, match="workers_per_node must be >= 1, got 0"):
        threads_per_process(0, cores=2)


def test_worker_env_sets_the_budget_and_passive_waiting():
    env = worker_env(3)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_scale_config_checks():
    from feedbackrl.config import ConfigError, build_config

    assert not build_config({}).scale.uses_ray  # the default is one process
    with pytest.raises(ConfigError, match="scale.max_staleness=1 needs scale.rollout_workers >= 1"):
        build_config({"scale": {"max_staleness": 1}})
    from feedbackrl.train.run import check_run

    with pytest.raises(ConfigError, match="scale.rollout_workers / scale.reward_workers: algo.name = 'ppo' does not "
                                          "run with it so far; set both to 0"):
        check_run(build_config({"algo": {"name": "ppo"}, "scale": {"rollout_workers": 2}}), None)
    with pytest.raises(ConfigError, match="sample the rollouts of online RL"):
        build_config({"algo": {"name": "dpo"}, "scale": {"rollout_workers": 2}})


def test_importing_feedbackrl_first_makes_openmp_wait_passively():
    # OMP_DISPLAY_ENV=VERBOSE makes libgomp print the settings it read when torch loaded it; the wait policy line
    # reads PASSIVE even when unset, the spin count tells: 300000 spins unset, 0 when passive
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = "import feedbackrl, torch; torch.ones(4, 4) @ torch.ones(4, 4)"
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_DISPLAY_ENV": "VERBOSE"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "GOMP_SPINCOUNT = '0'" in proc.stderr, proc.stderr[-2000:]
    kept = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_DISPLAY_ENV": "VERBOSE",
                                                             "OMP_WAIT_POLICY": "ACTIVE"},
                          capture_output=True, text=True, timeout=120)
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in kept.stderr  # the user's choice wins
