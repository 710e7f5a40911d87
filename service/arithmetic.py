"""One floating-point arithmetic for the NumPy backend on every x86-64 processor with AVX2.

NumPy's loops and OpenBLAS's kernels are chosen by the processor's features when they load, so
a NumPy job sums in other orders on an AVX-512 processor than on an AVX2 one, and the agent it
trains ends elsewhere by more than its evaluation's interval. `pin_arithmetic` chooses their
AVX2 level (x86-64-v3) for both before NumPy is imported (the `trident` command calls it first),
which AVX-512 processors run too: the same job gives the same bytes on either. A variable the
user has set is kept; TRIDENT_NATIVE_ARITHMETIC=1 leaves both to the processor.
"""

from __future__ import annotations

import os
import platform
from collections.abc import MutableMapping
from pathlib import Path

AVX2_ARITHMETIC = {
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",  # NumPy's loops past AVX2
    "OPENBLAS_CORETYPE": "Haswell",  # OpenBLAS's AVX2 kernels and their blocking
}
NATIVE = "TRIDENT_NATIVE_ARITHMETIC"


def runs_avx2(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this is an x86-64 processor with AVX2 and FMA (read from Linux's cpuinfo)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    return {"avx2", "fma"} <= set(flags)


def pin_arithmetic(environ: MutableMapping[str, str] = os.environ,
                   avx2: bool | None = None) -> dict[str, str]:  # fmt: skip
    """Set each of AVX2_ARITHMETIC's variables that `environ` leaves unset, on a processor
    that runs AVX2 (`avx2`: whether it does; None: this one's), unless NATIVE is 1; the
    variables it set."""
    if environ.get(NATIVE) == "1" or not (runs_avx2() if avx2 is None else avx2):
        return {}
    chosen = {name: value for name, value in AVX2_ARITHMETIC.items() if name not in environ}
    environ.update(chosen)
    return chosen
