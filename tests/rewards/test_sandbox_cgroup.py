"""The job cgroup's bookkeeping against a fake cgroup tree: which version is chosen, which limits are
written, and how the memory-limit counters are read (this machine may only have one version)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from feedbackrl.rewards import sandbox_cgroup


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(sandbox_cgroup, "ROOT", str(tmp_path))
    monkeypatch.setattr(sandbox_cgroup.os, "geteuid", lambda: 0)
    return tmp_path


def test_v2_with_delegated_controllers(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_cgroup, "_own_paths", lambda: {"": "/svc"})
    (fake_root / "svc").mkdir()
    (fake_root / "svc" / "cgroup.subtree_control").write_text("cpu memory pids\n")
    job, why = sandbox_cgroup.create("feedbackrl-7", 256, 64)
    assert (job, why) == ({"version": 2, "dirs": [str(fake_root / "svc" / "feedbackrl-7")]}, "")
    written = {p.name: p.read_text() for p in (fake_root / "svc" / "feedbackrl-7").iterdir()}
    assert written == {"memory.max": str(256 << 20), "pids.max": "64", "memory.oom.group": "1",
                       "memory.swap.max": "0"}


def test_v1_when_v2_has_no_memory_controller(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_cgroup, "_own_paths", lambda: {"": "/", "memory": "/box", "pids": "/"})
    (fake_root / "cgroup.subtree_control").mkdir()  # cannot be read or written: no usable v2 here
    (fake_root / "memory" / "box").mkdir(parents=True)
    (fake_root / "pids").mkdir()
    job, why = sandbox_cgroup.create("feedbackrl-8", 128, 64)
    assert why == "" and job == {"version": 1, "dirs": [str(fake_root / "memory" / "box" / "feedbackrl-8"),
                                                        str(fake_root / "pids" / "feedbackrl-8")]}
    memory = fake_root / "memory" / "box" / "feedbackrl-8"
    assert (memory / "memory.limit_in_bytes").read_text() == str(128 << 20)
    assert (fake_root / "pids" / "feedbackrl-8" / "pids.max").read_text() == "64"


def test_neither_version_says_why(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_cgroup, "_own_paths", lambda: {"": "/"})
    (fake_root / "cgroup.subtree_control").mkdir()  # unreadable as a file: no usable v2
    job, why = sandbox_cgroup.create("feedbackrl-9", 128, 64)
    assert job is None
    assert why.startswith("no cgroup v2 with the memory and pids controllers delegated at ")
    assert "no writable v1 memory and pids hierarchies" in why


@pytest.mark.parametrize(("version", "files", "hits"), [
    # v2 memory.events: `max` (the limit was reached) + `oom_kill`
    (2, {"memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n"}, 4),
    # v1: memory.failcnt (a bare number) + memory.oom_control's `oom_kill`
    (1, {"memory.failcnt": "5\n", "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"}, 7),
])
def test_limit_hits_add_up_the_kernel_counters(tmp_path: Path, version: int, files: dict, hits: int) -> None:
    (tmp_path / "cgroup.procs").write_text("")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    job = sandbox_cgroup.JobCgroup({"version": version, "dirs": [str(tmp_path)]})
    assert job.limit_hits() == hits
    (tmp_path / list(files)[0]).write_text(files[list(files)[0]].replace("3", "9").replace("5", "6"))
    assert job.limit_hits() == hits + (6 if version == 2 else 1)
    for fd in [*job.procs, *job.events]:
        os.close(fd)
