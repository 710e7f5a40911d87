"""CUDA graphs for the trainer's device work: capture a call once per shape, replay it after.

`CapturedCalls.run(key, fn)` runs `fn` (which only queues device work on the current stream)
eagerly the first time `key` is seen, which compiles the kernels and creates the cuBLAS
handle outside any capture; the second time it captures `fn` into a CUDA graph and launches
it; from then on it only launches the graph. What `fn` returned at capture is returned by
every replay: those arrays are rewritten in place each time.

Memory. Allocations made while capturing come from a private CuPy pool that nothing else
uses, so no later allocation can take an address a graph writes to. A graph's temporaries go
back to that pool when the capture ends and may be reused by the next capture: graphs replay
one at a time on one stream, so the reuse is ordered. Inputs a graph reads (static buffers,
parameters, the hyper-parameter vector) are allocated outside and kept by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import cupy


class CapturedCalls:
    """Graphs keyed by shape, on one non-blocking stream (a `CudaExecutor`'s)."""

    def __init__(self, stream: cupy.cuda.Stream) -> None:
        self.stream = stream
        self.captures = 0  # graphs captured so far (a test checks nothing re-captures)
        self._pool = cupy.cuda.MemoryPool()
        self._warm: set[Hashable] = set()
        self._graphs: dict[Hashable, tuple[cupy.cuda.Graph, Any]] = {}

    def run(self, key: Hashable, fn: Callable[[], Any]) -> Any:
        """fn's result: eager on the first call of `key`, then from its graph."""
        entry = self._graphs.get(key)
        if entry is None:
            if key not in self._warm:
                self._warm.add(key)
                return fn()
            entry = self._graphs[key] = self._capture(fn)
        graph, outputs = entry
        graph.launch(self.stream)
        return outputs

    def launch(self, key: Hashable, stream: cupy.cuda.Stream) -> Any:
        """Replay the captured graph of `key` on `stream` (`CudaExecutor.replay`)."""
        graph, outputs = self._graphs[key]
        graph.launch(stream)
        return outputs

    def _capture(self, fn: Callable[[], Any]) -> tuple[cupy.cuda.Graph, Any]:
        with self.stream, cupy.cuda.using_allocator(self._pool.malloc):
            self.stream.begin_capture()
            try:
                outputs = fn()
            except BaseException:
                self.stream.end_capture()  # leave the stream usable; the graph is dropped
                raise
            graph = self.stream.end_capture()
        self.captures += 1
        return graph, outputs
