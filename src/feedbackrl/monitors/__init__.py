"""Reward-hacking and health monitors: pure detectors over each step's completions, verdicts and metrics.

`Monitor.after_step` runs live in every on-policy loop; `replay` audits a finished run's logs;
`mark_alerts` draws alerts on a plot. Detectors are registered by name in `registry.DETECTORS`.
`safety` holds the safety evaluation's statistics (violation rates per scenario, refusals).
"""
