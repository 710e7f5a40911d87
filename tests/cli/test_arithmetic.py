"""The `trident` command chooses NumPy's and OpenBLAS's AVX2 arithmetic before NumPy loads, so a
NumPy job gives the same bytes on AVX2 and AVX-512 processors; a user's own choice is kept."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

from service.arithmetic import AVX2_ARITHMETIC, NATIVE, pin_arithmetic, runs_avx2


def test_the_avx2_arithmetic_fills_what_the_user_left_unset() -> None:
    environ = {"OPENBLAS_CORETYPE": "SkylakeX"}
    chosen = pin_arithmetic(environ, avx2=True)
    assert chosen == {"NPY_DISABLE_CPU_FEATURES": AVX2_ARITHMETIC["NPY_DISABLE_CPU_FEATURES"]}
    assert environ["OPENBLAS_CORETYPE"] == "SkylakeX"
    assert pin_arithmetic(environ, avx2=True) == {}  # set already


def test_nothing_is_chosen_without_avx2_or_where_the_user_asks_for_the_native_one() -> None:
    environ: dict[str, str] = {}
    assert pin_arithmetic(environ, avx2=False) == {} and environ == {}
    environ = {NATIVE: "1"}
    assert pin_arithmetic(environ, avx2=True) == {} and environ == {NATIVE: "1"}
    assert pin_arithmetic({}, avx2=True) == AVX2_ARITHMETIC


def test_avx2_is_read_from_the_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx fma avx2 avx512f\n")
    assert runs_avx2(cpuinfo) == (platform.machine().lower() in ("x86_64", "amd64"))
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx\n")
    assert not runs_avx2(cpuinfo)
    assert not runs_avx2(tmp_path / "missing")


def test_the_command_package_loads_no_numpy_before_it_chooses() -> None:
    """`python -m service.cli` and the `trident` script import service.cli first: NumPy must
    not load with it, or the choice comes too late."""
    probe = "import sys, service.cli; print('numpy' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    assert loaded == "False"
