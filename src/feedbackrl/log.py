"""Metric sinks and console output.

Metrics always go to a JSONL file (one object per step, plot-ready); TensorBoard is an optional
extra sink. `MetricsSink` is the seam: anything with `log(step, metrics)` and `close()`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

console = Console(stderr=True)


class MetricsSink(Protocol):
    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class JsonlSink:
    """Appends one JSON line per `log` call; reopening an existing file appends (resume)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._f.write(json.dumps({"step": step, **{k: _clean(v) for k, v in metrics.items()}}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class TensorBoardSink:
    def __init__(self, logdir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on the optional extra
            raise RuntimeError("train.tensorboard=true needs `pip install 'feedbackrl[tensorboard]'`") from e
        self._w = SummaryWriter(str(logdir))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for k, v in metrics.items():
            v = _clean(v)
            if isinstance(v, int | float):
                self._w.add_scalar(k, v, step)

    def close(self) -> None:
        self._w.close()


class MemorySink:
    """Keeps every (step, metrics) row in memory: for tests, notebooks and scripts that drive a loop."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, Any]]] = []

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.rows.append((step, metrics))

    @property
    def by_step(self) -> dict[int, dict[str, Any]]:
        """The last row logged at each step."""
        return dict(self.rows)

    def close(self) -> None:
        pass


class MultiSink:
    def __init__(self, sinks: list[MetricsSink]) -> None:
        self.sinks = sinks

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for s in self.sinks:
            s.log(step, metrics)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def progress():
    """A rich progress bar for long work (steps, eval batches)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console, transient=False)
