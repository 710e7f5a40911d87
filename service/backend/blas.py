"""BLAS threads for the NumPy backend.

The update's matrices are small (a few hundred rows by at most a few hundred columns): split
over threads, a GEMM spends more on synchronisation than it saves, and on a machine with few
cores the BLAS pool's waiting threads take cores from the environments. So the jobs that train
on the NumPy backend run with one BLAS thread (docs/benchmarks/blas_threads.md has the times).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from threadpoolctl import threadpool_info, threadpool_limits


@contextmanager
def single_blas_thread(backend: str) -> Iterator[None]:
    """One BLAS thread inside the block when `backend` is "numpy"; nothing otherwise."""
    if backend != "numpy":
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def blas_thread_counts() -> list[int]:
    """The threads of each BLAS pool loaded in this process now (what a bench records)."""
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
