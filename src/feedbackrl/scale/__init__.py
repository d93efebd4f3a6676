"""Running one recipe on more than one process: thread budgets, Ray rollout and reward workers, DDP glue.

Core code never imports this package at module level; the run path imports it lazily when a recipe's
`[scale]` section asks for it. Ray and vLLM are optional extras, imported inside the functions that use them.
"""
