"""feedbackrl: RL post-training from verifiable rewards and human feedback."""

__version__ = "0.1.0"
