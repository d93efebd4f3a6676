"""The rollout contracts between the tasks (`envs/`) and the training loops (`train/`, `scale/`).

`contracts.py` holds the types (`Batch`, `Scorer`, `EvalResult`, the `TaskKind` and `Collector`
protocols); each task kind brings its own collect step, evaluation and SFT rows: `single_turn.py`,
`multi_turn.py` (episodes played in this process) and `external.py` (episodes another program plays
against the served policy). `kinds.py` is the registry from the kind a task names (`Task.kind`) to its
implementation, and the entry points `collect`, `evaluate` and `InProcessCollector`.
"""
