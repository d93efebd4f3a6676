"""feedbackrl: RL post-training from verifiable rewards and human feedback."""

import os

# OpenMP threads that wait for work sleep instead of spinning. libgomp reads this once, when torch
# loads it, so it is set here, before the CLI imports torch; a value the user set is kept. On a
# shared 2-core machine the default wait made a short demo run 17x slower (docs/scale.md, Threads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # `feedbackrl.train(...)` after a bare `import feedbackrl`: the package is imported on first use (the
    # import stays light) and is itself callable (feedbackrl/train/__init__.py)
    if name == "train":
        import importlib

        return importlib.import_module("feedbackrl.train")
    raise AttributeError(f"module 'feedbackrl' has no attribute {name!r}")
