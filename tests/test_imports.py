"""Every module under feedbackrl imports on a bare CPU install (no module is skipped)."""

import importlib
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import feedbackrl

# Modules that are not package modules: they run inside the code sandbox as top-level scripts
# (`python -I -S`, their directory on sys.path), and import their sibling by its bare name.
SANDBOX_SCRIPTS = {"feedbackrl.rewards.sandbox_judge"}

MODULES = sorted(m.name for m in pkgutil.walk_packages(feedbackrl.__path__, "feedbackrl."))


def test_the_walk_finds_the_foundation():
    for name in ("feedbackrl.algos.advantages", "feedbackrl.train.grpo", "feedbackrl.cli",
                 "feedbackrl.envs.procedural.addition", *SANDBOX_SCRIPTS):
        assert name in MODULES


@pytest.mark.parametrize("name", [m for m in MODULES if m not in SANDBOX_SCRIPTS])
def test_import(name):
    importlib.import_module(name)


@pytest.mark.parametrize("name", sorted(SANDBOX_SCRIPTS))
def test_sandbox_script_imports_the_way_the_sandbox_loads_it(name):
    path = Path(importlib.util.find_spec(name).origin)
    code = f"import sys; sys.path.insert(0, {str(path.parent)!r}); import {path.stem}"
    proc = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
