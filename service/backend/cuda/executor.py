"""The CUDA executor: a trainer's stream, its side streams and its captured graphs.

All the trainer's device work is queued on one non-blocking stream. Work inside an update that
nothing downstream waits for at once (the target network, the on-policy heads, weight
gradients) forks onto one of three side streams after an event of the main one, and is joined
back by an event: inside a captured graph, parallel branches. With graphs on, `run` stages its
inputs in buffers kept per key and hands the call to `CapturedCalls` (eager, captured, then
replayed; see `capture.py`): the graph reads those buffers, so nothing on the host changes
inside it. Settings live in one float64 device vector (`DeviceScalars`) for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import cupy
import cupyx
import numpy as np

from service.backend.cuda.capture import CapturedCalls

T = TypeVar("T")

LANES = 4  # side streams: enough for the update's widest fork
# Captured calls of variable rows (Act) run at the next of these sizes, doubling beyond the
# last: one graph per size instead of one per row count an actor happens to send.
PADDED_ROWS = (64, 256, 1024)
URGENT_PRIORITY = -1000  # below any device's priority range (lower is more urgent)


class CudaExecutor:
    """One trainer's stream, side streams and (with `graphs`) captured calls."""

    def __init__(self, graphs: bool, urgent: bool = False) -> None:
        # urgent: the device's highest stream priority (CUDA clamps a number below its range
        # to the range's top), so that its kernels, captured ones too, are scheduled ahead of
        # those of executors at the default priority, 0.
        priority = URGENT_PRIORITY if urgent else 0
        self.stream = cupy.cuda.Stream(non_blocking=True, priority=priority)
        # The caller's arrays were written on the null stream, which a non-blocking stream
        # does not wait for: the executor's first work must come after them.
        self.stream.wait_event(cupy.cuda.Stream.null.record())
        self._lanes = [cupy.cuda.Stream(non_blocking=True, priority=priority)
                       for _ in range(LANES)]  # fmt: skip
        self._calls = CapturedCalls(self.stream) if graphs else None
        self._staged: dict[Hashable, tuple] = {}  # per key: the buffers its graph reads

    @property
    def captures(self) -> int:
        return 0 if self._calls is None else self._calls.captures

    def scope(self) -> cupy.cuda.Stream:
        return self.stream

    def fork(self, fn: Callable[[], T], lane: int = 0) -> tuple[T, object]:
        side = self._lanes[lane]
        side.wait_event(cupy.cuda.get_current_stream().record())
        with side:
            result = fn()
        return result, side.record()

    def join(self, token: object) -> None:
        cupy.cuda.get_current_stream().wait_event(token)

    def mark(self) -> object:
        return self.stream.record()

    def padded_rows(self, rows: int) -> int:
        if self._calls is None:
            return rows
        size = next((size for size in PADDED_ROWS if size >= rows), PADDED_ROWS[-1])
        while size < rows:
            size *= 2
        return size

    def padded_sizes(self, max_rows: int) -> list[int]:
        if self._calls is None:
            return []
        sizes = [size for size in PADDED_ROWS if size < max_rows]
        size = sizes[-1] if sizes else 0
        while size < max_rows:
            size = self.padded_rows(size + 1)
            sizes.append(size)
        return sizes

    def run(self, key: Hashable, fn: Callable[..., T], *inputs: Any) -> T:
        if self._calls is None:
            return fn(*inputs)
        staged = self._staged.get(key)
        if staged is None:
            staged = self._staged[key] = tuple(_buffer(value) for value in inputs)
        for buffer, value in zip(staged, inputs, strict=True):
            if buffer is None:
                continue
            if isinstance(value, cupy.ndarray):
                buffer[...] = value
            else:
                buffer.fill(float(value))
        return self._calls.run(key, lambda: fn(*staged))

    def replay(self, key: Hashable) -> Any:
        if self._calls is None:
            raise KeyError(f"no captured call {key!r}: train.cuda_graphs is off")
        return self._calls.launch(key, cupy.cuda.get_current_stream())

    def synchronize(self) -> None:
        self.stream.synchronize()

    def synchronize_device(self) -> None:
        cupy.cuda.Device().synchronize()


def upload(host: np.ndarray) -> cupy.ndarray:
    """`host` on the device, copied on the current stream: without a staging copy on the host,
    and without waiting when `host` is pinned (`empty_pinned`)."""
    host = np.ascontiguousarray(host)
    device = cupy.empty(host.shape, host.dtype)
    if host.size:
        device.set(host, stream=cupy.cuda.get_current_stream())
    return device


def empty_pinned(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A host array in page-locked memory (CuPy's pinned pool): the device copies it by DMA."""
    return cupyx.empty_pinned(shape, dtype)


def _buffer(value: Any) -> cupy.ndarray | None:
    """A graph's own copy of an input: C-contiguous like it, or a float64 [1] for a number."""
    if value is None:
        return None
    if isinstance(value, cupy.ndarray):
        return cupy.empty(value.shape, value.dtype)
    return cupy.empty(1)


class DeviceScalars:
    """Settings in one float64 device vector, handed out as views of it (or gathers)."""

    def __init__(self, values: np.ndarray) -> None:
        self._vector = cupy.asarray(values)
        self._gathers: dict[tuple[int, ...], cupy.ndarray] = {}

    def one(self, index: int) -> cupy.ndarray:
        return self._vector[index : index + 1]

    def span(self, start: int, stop: int) -> cupy.ndarray:
        return self._vector[start:stop]

    def gather(self, indices: tuple[int, ...]) -> cupy.ndarray:
        """A gather kernel, so it follows `write` inside a graph; its index array is uploaded
        once, on first use: outside any capture, since a shape runs eagerly first."""
        rows = self._gathers.get(indices)
        if rows is None:
            rows = self._gathers[indices] = cupy.asarray(list(indices))
        return self._vector[rows]

    def write(self, values: np.ndarray) -> None:
        self._vector[...] = cupy.asarray(values)
