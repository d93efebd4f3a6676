"""Where the code sandbox cannot run, its tests skip; under FEEDBACKRL_REQUIRE_SANDBOX=1 (CI) they fail.

Checked end to end: a pytest run of one sandboxed test with `unshare` off the PATH, so the probe
finds a gap, once plain (skipped, exit 0) and once with the variable set (an error, exit 1).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TARGET = "tests/envs/test_python_tool.py::test_state_carries_within_an_episode_and_failed_cells_are_not_replayed"


def run_without_unshare(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "bin").mkdir(exist_ok=True)  # a PATH with no `unshare` on it
    environ = {k: v for k, v in os.environ.items() if k != "FEEDBACKRL_REQUIRE_SANDBOX"}
    environ |= {"PATH": str(tmp_path / "bin"), "PYTHONPATH": str(REPO / "src"), **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", TARGET],
                          cwd=REPO, env=environ, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("required", [False, True], ids=["skipped", "required"])
def test_missing_sandbox_skips_or_fails_as_asked(tmp_path: Path, required: bool) -> None:
    out = run_without_unshare(tmp_path, **({"FEEDBACKRL_REQUIRE_SANDBOX": "1"} if required else {}))
    text = out.stdout + out.stderr
    assert "code sandbox unavailable here: unshare unavailable" in text, text[-2000:]
    if required:
        assert out.returncode == 1 and "1 error" in text, text[-2000:]  # failed in setup: CI goes red
        assert "FEEDBACKRL_REQUIRE_SANDBOX=1 makes this a failure" in text
    else:
        assert out.returncode == 0 and "1 skipped" in text, text[-2000:]
