"""feedbackrl: RL post-training from verifiable rewards and human feedback."""

import os

# OpenMP threads that wait for work sleep instead of spinning. libgomp reads this once, when torch
# loads it, so it is set here, before the CLI imports torch; a value the user set is kept. On a
# shared 2-core machine the default wait made a short demo run 17x slower (docs/scale.md, Threads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
