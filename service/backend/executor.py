"""Where a trainer's device work runs, and how the ops take its settings.

An `Executor` owns the device for one trainer: the scope its work is queued in, side lanes for
independent work inside an update (`fork`, then `join` before anything reads the result), and
calls captured once per key and replayed after (`run`). Code above the backend asks for these
and never learns what a lane or a capture is. NumPy has none of them: `NumpyExecutor` runs
everything inline, at once. `service.backend.cuda.executor.CudaExecutor` owns a CUDA stream,
its side streams and its graphs.

`Scalars` hold the settings the ops read (learning rates, γ, ...) as the op set takes them:
Python floats on NumPy (NumPy's weak scalars: a float32 array times one stays float32), one
float64 vector in device memory elsewhere, handed out as views, so a captured call reads the
values written after its capture.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, TypeVar

import numpy as np

T = TypeVar("T")


class Executor(Protocol):
    """Runs one trainer's device work: a scope, side lanes, captured calls."""

    @property
    def captures(self) -> int:
        """Calls captured so far (a test checks that nothing is captured twice)."""
        ...

    def scope(self) -> AbstractContextManager[object]:
        """Queue the block's device work on the executor's main lane."""
        ...

    def fork(self, fn: Callable[[], T], lane: int = 0) -> tuple[T, object]:
        """fn's device work on side lane `lane`, after everything queued so far on the
        current lane; returns fn's result and the token `join` takes."""
        ...

    def join(self, token: object) -> None:
        """Make the current lane wait for the work of the `fork` or `mark` that gave `token`."""
        ...

    def mark(self) -> object:
        """A token for the work queued so far on the main lane: another executor's lane that
        `join`s it waits for that work (how a copy between two trainers' lanes is ordered)."""
        ...

    def padded_rows(self, rows: int) -> int:
        """The rows a call of `rows` rows should be padded to: a capturing executor keeps one
        graph per shape, so it rounds row counts up to a few sizes."""
        ...

    def padded_sizes(self, max_rows: int) -> list[int]:
        """Every row count `padded_rows` gives for 1 to `max_rows` rows, smallest first: the
        shapes a capturing executor keeps graphs of (none where nothing is captured)."""
        ...

    def run(self, key: Hashable, fn: Callable[..., T], *inputs: Any) -> T:
        """fn(*inputs)'s result, where fn only queues device work. A capturing executor calls
        fn on copies of the inputs it keeps per `key` (arrays: same shape and dtype; None
        stays None; numbers: float64 [1] device scalars), eagerly the first time `key` is
        seen, captured the second time, and from then on replays the capture: the arrays fn
        returned at capture are rewritten in place and returned by every replay."""
        ...

    def replay(self, key: Hashable) -> Any:
        """Queue the capture of `key` once more on the caller's current lane, inputs as they
        were last staged (a benchmark's timing hook); returns its outputs."""
        ...

    def synchronize(self) -> None:
        """Wait for the work queued on the main lane."""
        ...

    def synchronize_device(self) -> None:
        """Wait for all work on the device, work queued outside this executor included."""
        ...


class NumpyExecutor:
    """The host has no lanes and nothing to capture: every call runs inline, at once."""

    @property
    def captures(self) -> int:
        return 0

    def scope(self) -> AbstractContextManager[object]:
        return nullcontext()

    def fork(self, fn: Callable[[], T], lane: int = 0) -> tuple[T, object]:
        return fn(), None

    def join(self, token: object) -> None:
        pass

    def mark(self) -> object:
        return None

    def padded_rows(self, rows: int) -> int:
        return rows

    def padded_sizes(self, max_rows: int) -> list[int]:
        return []

    def run(self, key: Hashable, fn: Callable[..., T], *inputs: Any) -> T:
        return fn(*inputs)

    def replay(self, key: Hashable) -> Any:
        raise KeyError(f"no captured call {key!r}: the NumPy executor captures nothing")

    def synchronize(self) -> None:
        pass

    def synchronize_device(self) -> None:
        pass


class Scalars(Protocol):
    """A vector of settings, read the way the backend's ops take a setting."""

    def one(self, index: int) -> Any:
        """Setting `index`."""
        ...

    def span(self, start: int, stop: int) -> Any:
        """Settings [start, stop) as one argument."""
        ...

    def gather(self, indices: tuple[int, ...]) -> Any:
        """Settings `indices` (any order) as one argument."""
        ...

    def write(self, values: np.ndarray) -> None:
        """Overwrite every setting, in place: what was handed out reads the new values."""
        ...


class HostScalars:
    """Settings as Python floats, read from the vector at each call."""

    def __init__(self, values: np.ndarray) -> None:
        self._values = np.array(values, dtype=np.float64)

    def one(self, index: int) -> float:
        return float(self._values[index])

    def span(self, start: int, stop: int) -> list[float]:
        return self.gather(tuple(range(start, stop)))

    def gather(self, indices: Sequence[int]) -> list[float]:
        return [self.one(index) for index in indices]

    def write(self, values: np.ndarray) -> None:
        self._values[:] = values
