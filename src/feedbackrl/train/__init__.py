"""The training loops (one file per algorithm, `run.py` the one run path) and `feedbackrl.train(...)` itself.

The package is callable: `feedbackrl.train(recipe, out=..., reward=..., task=..., overrides=...)` is
`feedbackrl.train.api.train`, the Python API mirroring `feedbackrl train` (its docstring has the arguments).
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    """This package, callable as `feedbackrl.train(...)` (importing it stays light: nothing below is loaded)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        from feedbackrl.train.api import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
