"""Keep freed NumPy buffers in the process heap (glibc) instead of handing them back to the OS.

An update allocates and frees the same large temporaries every time. By default glibc serves
blocks over 128 KiB-32 MiB with mmap and unmaps them on free, so the next update faults in fresh
zeroed pages, a large share of the update's time (bench/cpu_step.py --profile counts
them). Raising the mmap threshold and the trim threshold makes those blocks come
back from the heap. Process-wide, once; a no-op where the C library is not glibc.

`limit_malloc_arenas` (the server calls it at start-up) caps glibc's per-thread arenas; see
its docstring.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 1024 * 1024 * 1024
TOP_PAD = 64 * 1024 * 1024
ARENA_MAX = 1


def _mallopt():  # libc's mallopt, or None
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return None


@functools.cache
def retain_freed_memory() -> bool:
    """Apply the settings once; True when glibc accepted all of them."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_TOP_PAD, TOP_PAD),
    )
    return all(mallopt(option, value) == 1 for option, value in settings)


@functools.cache
def limit_malloc_arenas() -> bool:
    """Let every thread allocate from one glibc arena; True when glibc accepted it.

    By default glibc gives threads that allocate at the same time arenas of their own, up to
    8 per core. `trident serve` has ~25 threads (gRPC's pollers and handler pool, the Step and
    Act workers, the metrics server), so it ends up with 16 arenas on 2 cores, each reaching
    its own high-water mark as the actors' requests overlap in different ways, and each padded
    by TOP_PAD. In the 16-actor soak (bench/soak.py) the server's RSS kept rising for about
    10 minutes (83.4 -> 85.0 MiB, then flat: bench/results/soak_1800s.json) while the bytes in
    use stayed flat, so the 10-minute drift bound failed (+0.7 to +2.1 % per 10 minutes). With
    one arena the RSS levels off within the first minute, 2-3 MiB lower: +0.55 and +0.70 % in
    two 10-minute soaks, against +1.38 % for a control run with this call disabled, and the
    Step / Act p50s did not move (Python's threads allocate under the GIL anyway). Must run
    before the threads start (arenas already handed out stay); a no-op where the C library is
    not glibc.
    """
    mallopt = _mallopt()
    return mallopt is not None and mallopt(_M_ARENA_MAX, ARENA_MAX) == 1
