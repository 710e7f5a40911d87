"""Keep freed NumPy buffers in the process heap (glibc) instead of handing them back to the OS.

An update allocates and frees the same large temporaries every time. By default glibc serves
blocks over 128 KiB-32 MiB with mmap and unmaps them on free, so the next update faults in fresh
zeroed pages: at B=4096 about 7,600 page faults and a fifth of the update's time
(bench/README.md). Raising the mmap threshold and the trim threshold makes those blocks come
back from the heap. Process-wide, once; a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 1024 * 1024 * 1024
TOP_PAD = 64 * 1024 * 1024


@functools.cache
def retain_freed_memory() -> bool:
    """Apply the settings once; True when glibc accepted all of them."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_TOP_PAD, TOP_PAD),
    )
    return all(mallopt(option, value) == 1 for option, value in settings)
