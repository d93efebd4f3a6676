"""A Python tool for episodes, run through the code sandbox (`rewards/sandbox.py`).

Each call runs in a fresh throwaway sandbox (the same isolation as code rewards: no network, a
private PID namespace whose processes all die with the call, a read-only filesystem with a fresh
tmpfs working directory, a job-unique uid, rlimits), so nothing a call starts or writes survives
it, and no episode can see another's state. The tool is stateful per episode by replay: a call runs
the episode's earlier successful cells (their output discarded) and then the new one, so variables
and functions carry over within the episode. Replay reruns side effects (a random draw gives a
new value); cells that failed are not replayed.

The observation is what the new cell printed (stdout, then the last line of stderr on an error),
cut to `max_chars`; a timeout or a sandbox failure is an error observation.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from feedbackrl.rewards.sandbox import Limits, run_program


@dataclass
class PythonTool:
    """One episode's Python interpreter. `isolate=False` only where the sandbox's namespaces are unavailable."""

    limits: Limits = field(default_factory=lambda: Limits(timeout_s=2.0, memory_mb=256, max_output_bytes=65_536))
    isolate: bool = True
    max_chars: int = 200
    cells: list[str] = field(default_factory=list)
    leaked: int = 0  # processes found still running as a call's uid after the sandbox closed (expected 0)

    def __call__(self, code: str) -> str:
        marker = f"--cell-{secrets.token_hex(8)}--"  # unguessable: earlier cells' output ends before it
        program = "".join(c + "\n" for c in self.cells) + f"print({marker!r}, flush=True)\n" + code + "\n"
        result = run_program(program, inputs=[""], limits=self.limits, isolate=self.isolate)
        self.leaked += int(result.get("leaked", 0))
        if "error" in result:
            raise RuntimeError(result["error"][:120])
        test = result["tests"][0]
        stdout = test.get("stdout", "")
        out = stdout.split(marker + "\n", 1)[1] if marker + "\n" in stdout else ""
        if test["outcome"] == "timeout":
            raise TimeoutError(f"python cell ran past {self.limits.timeout_s:g}s")
        if test["outcome"] != "done":
            lines = test.get("stderr", "").strip().splitlines()
            return (out + "error: " + (lines[-1] if lines else test["outcome"]))[-self.max_chars:]
        self.cells.append(code)
        return out[: self.max_chars]
