"""The kernels without a GPU: every .cu compiles with nvcc, no atomics anywhere, Philox in
common.cuh matches philox.py on the host, and the compiled-module cache key and files.

nvcc is required where CI=true; elsewhere the nvcc tests skip when it is absent.
Random inputs are fresh each run; the seed is printed and can be pinned with
TRIDENT_TEST_SEED=<seed>.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from service.backend.cuda import loader
from service.backend.philox import below, philox4x32, uniform01

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
BENCH = Path(__file__).resolve().parents[2] / "bench"
CU_FILES = sorted(p.name for p in KERNELS.glob("*.cu"))
CU_PATHS = sorted([*KERNELS.glob("*.cu"), *(BENCH / "kernels").glob("*.cu")])  # bench's too
SOURCES = sorted([*CU_PATHS, *KERNELS.glob("*.cuh")])


@pytest.fixture(scope="module")
def nvcc() -> str:
    path = shutil.which("nvcc")
    if path is None:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail("nvcc is not on PATH, and CI must compile every kernel")
        pytest.skip("nvcc is not on PATH (install the CUDA toolkit to compile-check kernels)")
    return path


# --------------------------------------------------------------------------- nvcc
def test_kernel_files_present() -> None:
    assert (KERNELS / "common.cuh").is_file()
    assert CU_FILES, "no kernels/*.cu"


@pytest.mark.parametrize("path", CU_PATHS, ids=lambda p: p.name)
def test_kernel_compiles_with_nvcc(nvcc: str, path: Path, tmp_path: Path) -> None:
    """nvcc -arch=sm_90 -std=c++17 -I kernels -cubin, plus the loader's NVRTC options: the
    device code compiled to sm_90 machine code (what NVRTC does at run time), no host pass."""
    extra = [opt for opt in loader.COMPILE_OPTIONS if opt != "-std=c++17"]
    cmd = [nvcc, "-arch=sm_90", "-std=c++17", *extra, "-I", str(KERNELS), "-cubin"]
    cmd += [str(path), "-o", str(tmp_path / "out.cubin")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stdout}\n{result.stderr}"


HOST_PHILOX = r"""
#include <cstdio>
#include "common.cuh"
int main() {
    unsigned int c0, c1, c2, c3, k0, k1;
    while (std::scanf("%x %x %x %x %x %x", &c0, &c1, &c2, &c3, &k0, &k1) == 6) {
        uint4 c; c.x = c0; c.y = c1; c.z = c2; c.w = c3;
        uint2 k; k.x = k0; k.y = k1;
        const uint4 r = trident_philox4x32_10(c, k);
        std::printf("%08x %08x %08x %08x %a %u\n", r.x, r.y, r.z, r.w,
                    (double)trident_uniform01(r.x), trident_below(r.y, 9u + (r.z % 1000u)));
    }
    return 0;
}
"""

KAT = [  # Random123 kat_vectors, philox4x32 with 10 rounds
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def test_common_philox_matches_python_on_host(
    nvcc: str, tmp_path: Path, rng: np.random.Generator
) -> None:
    """common.cuh's Philox and its mappings, run on the CPU, equal philox.py bit for bit."""
    source = tmp_path / "host_philox.cu"
    source.write_text(HOST_PHILOX)
    exe = tmp_path / "host_philox"
    cmd = [nvcc, "-std=c++17", "-I", str(KERNELS), str(source), "-o", str(exe)]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr

    counters = rng.integers(0, 2**32, size=(64, 4), dtype=np.uint64).astype(np.uint32)
    keys = rng.integers(0, 2**32, size=(64, 2), dtype=np.uint64).astype(np.uint32)
    cases = [(c, k) for c, k, _ in KAT] + [
        (tuple(int(v) for v in c), tuple(int(v) for v in k))
        for c, k in zip(counters, keys, strict=True)
    ]
    lines = "".join(" ".join(f"{v:x}" for v in (*c, *k)) + "\n" for c, k in cases)
    ran = subprocess.run([str(exe)], input=lines, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    out = ran.stdout.split("\n")
    for i, (counter, key) in enumerate(cases):
        words = out[i].split()
        got = tuple(int(w, 16) for w in words[:4])
        want = philox4x32(np.array(counter, dtype=np.uint32), key)
        assert got == tuple(int(v) for v in want), f"case {i}: counter {counter} key {key}"
        if i < len(KAT):
            assert got == KAT[i][2]
        assert float.fromhex(words[4]) == float(uniform01(want[:1])[0])
        assert int(words[5]) == int(below(want[1:2], 9 + int(want[2]) % 1000)[0])


# --------------------------------------------------------------------------- no atomics
def strip_comments(source: str) -> str:
    """C/C++ source without // and /* */ comments (string literals kept: inline PTX counts)."""
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", source)


ATOMIC_PATTERNS = [
    re.compile(r"\batomic[A-Z]\w*\s*\("),  # atomicAdd, atomicCAS, atomicMax, atomicAdd_block, ...
    re.compile(r"__(?:nv_)?atomic"),  # __atomic_fetch_add, __nv_atomic_*
    re.compile(r"\b(?:cuda|std)\s*::\s*atomic"),  # cuda::atomic, cuda::atomic_ref, std::atomic
    re.compile(r"\batomic(?:_ref)?\s*<"),  # atomic<T> / atomic_ref<T> after a using-declaration
    re.compile(r"\batom\.\w"),  # inline PTX atom.global.add...
    re.compile(
        r"\bred\.(?:global|shared|relaxed|release|acq_rel|sys|gpu|cta|add|and|or|xor|min|max)"
    ),
]


def atomics_in(source: str) -> list[str]:
    code = strip_comments(source)
    return [m.group(0) for pattern in ATOMIC_PATTERNS for m in pattern.finditer(code)]


@pytest.mark.parametrize(
    "snippet",
    [
        "atomicAdd(&x[0], 1.0f);",
        "atomicCAS (p, 0, 1);",
        "atomicAdd_block(p, 1);",
        "cuda::atomic_ref<float, cuda::thread_scope_device> r(x[0]);",
        "std::atomic<int> n;",
        "__atomic_fetch_add(p, 1, __ATOMIC_RELAXED);",
        'asm volatile("red.global.add.f32 [%0], %1;" :: "l"(p), "f"(v));',
        'asm("atom.global.add.u32 %0, [%1], 1;" : "=r"(o) : "l"(p));',
    ],
)
def test_atomic_detector_catches(snippet: str) -> None:
    assert atomics_in(snippet)


def test_atomic_detector_ignores_comments() -> None:
    assert not atomics_in("// no atomicAdd(...) here\n/* nor atomicCAS(p) */ int atomics = 0;")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_atomics(path: Path) -> None:
    found = atomics_in(path.read_text())
    assert not found, f"{path.name} uses atomics {found}: reductions must run in a fixed order"


# --------------------------------------------------------------------------- cache key
OPTIONS = loader.COMPILE_OPTIONS
DEFINES = {"TRIDENT_H": 256, "TRIDENT_A": 9}


@pytest.fixture
def kernel_copy(tmp_path: Path) -> Path:
    root = tmp_path / "kernels"
    shutil.copytree(KERNELS, root)
    return root


def key(root: Path, file: str = "gae.cu", **changes: object) -> str:
    args: dict[str, object] = {
        "options": OPTIONS,
        "defines": DEFINES,
        "arch": "90",
        "toolchain": "cupy=14.2.0;nvrtc=13.0",
    }
    args.update(changes)
    return loader.cache_key(file, kernel_root=root, **args)  # type: ignore[arg-type]


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_cache_key_is_stable(kernel_copy: Path) -> None:
    assert key(kernel_copy) == key(kernel_copy)
    assert key(kernel_copy) == key(kernel_copy, defines=dict(reversed(DEFINES.items())))
    assert re.fullmatch(r"[0-9a-f]{64}", key(kernel_copy))


def test_cache_key_follows_the_kernel_source(kernel_copy: Path) -> None:
    before = key(kernel_copy)
    flip_byte(kernel_copy / "gae.cu")
    assert key(kernel_copy) != before


def test_cache_key_follows_every_header(kernel_copy: Path) -> None:
    before = key(kernel_copy)
    flip_byte(kernel_copy / "common.cuh")
    after_edit = key(kernel_copy)
    assert after_edit != before
    (kernel_copy / "extra.cuh").write_text("#pragma once\n")
    assert key(kernel_copy) != after_edit


def test_cache_key_ignores_other_kernel_files(kernel_copy: Path) -> None:
    before = key(kernel_copy)
    flip_byte(kernel_copy / "adamw_step.cu")
    assert key(kernel_copy) == before


def test_cache_key_follows_options_defines_arch_toolchain(kernel_copy: Path) -> None:
    base = key(kernel_copy)
    variants = [
        key(kernel_copy, options=(*OPTIONS, "-lineinfo")),
        key(kernel_copy, options=tuple(o for o in OPTIONS if o != "--fmad=false")),
        key(kernel_copy, defines={**DEFINES, "TRIDENT_H": 37}),
        key(kernel_copy, defines={**DEFINES, "TRIDENT_Z": 51}),
        key(kernel_copy, arch="100"),
        key(kernel_copy, toolchain="cupy=14.3.0;nvrtc=13.0"),
        key(kernel_copy, file="encoder.cu"),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_cache_key_follows_abi_version(kernel_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = key(kernel_copy)
    monkeypatch.setattr(loader, "KERNEL_ABI_VERSION", loader.KERNEL_ABI_VERSION + 1)
    assert key(kernel_copy) != before


@pytest.mark.parametrize("file", ["../gae.cu", "gae", "sub/gae.cu", "gae.cuh"])
def test_cache_key_rejects_odd_file_names(kernel_copy: Path, file: str) -> None:
    with pytest.raises(ValueError, match="file"):
        key(kernel_copy, file=file)


@pytest.mark.parametrize("defines", [{"1BAD": 1}, {"X; rm": 1}, {"TRIDENT_H": 2.5}, {"A": True}])
def test_defines_are_checked(defines: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="defines"):
        loader.define_options(defines)  # type: ignore[arg-type]


def test_define_options_sorted() -> None:
    assert loader.define_options({"TRIDENT_Z": 51, "TRIDENT_A": 9}) == (
        "-DTRIDENT_A=9",
        "-DTRIDENT_Z=51",
    )


def test_dims_defines() -> None:
    dims = loader.CudaDims(D=16, H=37, A=9, Z=51, K=4)
    assert dims.defines() == {
        "TRIDENT_D": 16,
        "TRIDENT_H": 37,
        "TRIDENT_A": 9,
        "TRIDENT_Z": 51,
        "TRIDENT_K": 4,
    }


def test_kernel_dir_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loader.KERNEL_DIR_ENV, raising=False)
    assert loader.kernel_dir() == KERNELS
    monkeypatch.setenv(loader.KERNEL_DIR_ENV, str(tmp_path))
    with pytest.raises(loader.KernelSourceMissing, match=loader.KERNEL_DIR_ENV):
        loader.kernel_dir()
    # Installed from a wheel: no checkout beside the package, the sources under sys.prefix.
    monkeypatch.delenv(loader.KERNEL_DIR_ENV)
    monkeypatch.setattr(loader, "KERNEL_DIR", tmp_path / "no-checkout")
    monkeypatch.setattr(loader.sys, "prefix", str(tmp_path / "venv"))
    with pytest.raises(loader.KernelSourceMissing, match="share/trident/kernels"):
        loader.kernel_dir()
    installed = tmp_path / "venv" / "share" / "trident" / "kernels"
    installed.mkdir(parents=True)
    (installed / "common.cuh").write_text("// test\n")
    assert loader.kernel_dir() == installed


def test_wheel_ships_every_kernel_source(tmp_path: Path) -> None:
    """A wheel built from this tree carries kernels/*.cu and *.cuh as data files."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(KERNELS.parent)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("trident-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {Path(n).name for n in archive.namelist() if "/share/trident/kernels/" in n}
    want = {p.name for p in KERNELS.iterdir() if p.suffix in (".cu", ".cuh")}
    assert shipped == want


def test_cache_files_round_trip_and_verify(tmp_path: Path) -> None:
    blob = b"\x7fELF" + bytes(range(256))
    name = "ab" * 32
    path = loader.write_cached(tmp_path / "cache", name, blob)
    assert path.read_bytes() == blob
    assert loader.read_cached(tmp_path / "cache", name) == path
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".tmp")]
    flip_byte(path)  # a corrupt blob no longer matches its sidecar
    assert loader.read_cached(tmp_path / "cache", name) is None
    loader.write_cached(tmp_path / "cache", name, blob)
    (tmp_path / "cache" / f"{name}.cubin.sha256").unlink()  # nor does a missing sidecar
    assert loader.read_cached(tmp_path / "cache", name) is None


def test_cache_dir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loader.CACHE_DIR_ENV, str(tmp_path))
    assert loader.cache_dir() == tmp_path
    monkeypatch.delenv(loader.CACHE_DIR_ENV)
    assert loader.cache_dir() == Path.home() / ".cache" / "trident" / "kernels"


# --------------------------------------------------------------------------- wrappers
def kernel_define(file: str, name: str, root: Path = KERNELS) -> int:
    match = re.search(rf"#define {name} (\d+)", (root / file).read_text())
    assert match, f"{file} lacks #define {name}"
    return int(match.group(1))


def test_wrapper_constants_match_the_kernels() -> None:
    pytest.importorskip("cupy", reason="cupy is not installed")
    from service.backend.cuda import (
        act,
        c51,
        grad_norm_clip,
        launch,
        linear_heads,
        ppo,
        replay,
        step_stats,
        tensor_table,
    )

    threads = kernel_define("grad_norm_clip.cu", "TRIDENT_REDUCE_THREADS")
    items = kernel_define("grad_norm_clip.cu", "TRIDENT_REDUCE_ITEMS")
    assert (threads, threads * items) == (launch.REDUCE_THREADS, grad_norm_clip.REDUCE_CHUNK)
    assert kernel_define("common.cuh", "TRIDENT_BLOCK") == launch.BLOCK
    assert kernel_define("common.cuh", "TRIDENT_MAX_TENSORS") == tensor_table.MAX_TENSORS
    assert kernel_define("linear_heads.cu", "LINEAR_HEADS_MAX") == linear_heads.LINEAR_HEADS_MAX
    assert kernel_define("linear_heads.cu", "LINEAR_HEADS_TILE") == linear_heads.LINEAR_HEADS_TILE
    assert kernel_define("grad_norm_clip.cu", "TRIDENT_FINITE_SMALL") == grad_norm_clip.FINITE_SMALL
    small_max = kernel_define("grad_norm_clip.cu", "TRIDENT_FINITE_SMALL_MAX")
    assert small_max == grad_norm_clip.FINITE_SMALL_MAX
    assert kernel_define("replay.cu", "GATHER_MAX") == replay.GATHER_MAX
    assert kernel_define("ppo_clipped_surrogate.cu", "PPO_ROW_STATS") == ppo.PPO_ROW_STATS
    assert kernel_define("ppo_clipped_surrogate.cu", "PPO_STATS") == len(ppo.PPO_STATS)
    assert kernel_define("step_stats.cu", "STEP_STATS") == step_stats.STEP_STATS
    assert kernel_define("step_stats.cu", "STEP_NORM") == step_stats.STEP_NORM
    for mode, value in act.ACT_MODES.items():
        assert kernel_define("act.cu", f"ACT_MODE_{mode.upper()}") == value, mode
    assert kernel_define("categorical_projection.cu", "PROJ_THREADS") == c51.PROJ_THREADS


def test_gemm_tile_constants_match_the_bench_wrapper() -> None:
    pytest.importorskip("cupy", reason="cupy is not installed")
    spec = importlib.util.spec_from_file_location("tensor_core_gemm", BENCH / "tensor_core_gemm.py")
    assert spec is not None and spec.loader is not None
    gemm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gemm)

    root = BENCH / "kernels"
    assert kernel_define("gemm_tf32x3.cu", "GEMM_BN", root) == gemm.TILE_N
    assert kernel_define("gemm_tf32x3.cu", "GEMM_BK", root) == gemm.TILE_K
    assert kernel_define("gemm_tf32x3.cu", "GEMM_STAGES", root) == gemm.STAGES
    assert kernel_define("gemm_tf32x3.cu", "GEMM_THREADS", root) == 256
    source = gemm.KERNEL.read_text()
    assert "#define GEMM_KROW (GEMM_BK + 4)" in source and gemm.K_ROW == gemm.TILE_K + 4
    assert "#define GEMM_NROW (GEMM_BN + 8)" in source and gemm.N_ROW == gemm.TILE_N + 8
    entries = set(re.findall(r"^GEMM_ENTRY\((\w+), (\d+),", source, re.M))
    names = {
        "_".join(part for part in ("gemm_tf32x3", layout, epilogue, rows) if part)
        for layout, epilogues in gemm.LAYOUT_EPILOGUES.items()
        for epilogue in epilogues
        for rows in ("64", "128")
    }  # the names tensor_core_gemm asks for
    assert {name for name, _ in entries} == names
    assert all(name.endswith(f"_{rows}") for name, rows in entries)


def test_c51_taken_kernel_constants_match_the_wrapper() -> None:
    pytest.importorskip("cupy", reason="cupy is not installed")
    from service.backend.cuda import c51

    for name in ("C51_SORT_THREADS", "C51_TAKEN_THREADS", "C51_GRAD_THREADS",
                 "C51_SHARED_FLOATS", "C51_BWD_I"):  # fmt: skip
        assert kernel_define("dqn_distributional_q.cu", name) == getattr(c51, name), name
    warps = kernel_define("dqn_distributional_q.cu", "C51_GRAD_THREADS") // 32
    per_warp = kernel_define("dqn_distributional_q.cu", "C51_I_PER_WARP")
    assert warps * per_warp == c51.C51_I_TILE
    assert c51.c51_tile_rows(256, 51) == 16  # 256 + 2 · 51 floats a row beside 64 · 51: 25 fit
    assert c51.c51_tile_rows(1024, 101) == 4  # 1024 + 2 · 101 beside 64 · 101: 4 fit
    assert c51.c51_tile_rows(512, 64) == 12  # 512 + 2 · 64 beside 64 · 65: 12 fit
    with pytest.raises(ValueError, match=r"model\.hidden_dim"):
        c51.c51_tile_rows(10_000, 51)


TILE_ROWS_PROGRAM = r"""
#include <cstdio>
#include "dqn_distributional_q.cu"
int main() { std::printf("%d\n", C51_TILE_ROWS); return 0; }
"""


@pytest.mark.parametrize(("H", "Z"), [(256, 51), (1024, 101), (512, 64), (64, 8)])
def test_c51_tile_rows_of_the_kernel_and_the_wrapper_agree(
    nvcc: str, tmp_path: Path, H: int, Z: int
) -> None:
    """The wrapper sizes c51_taken_fwd_bwd's grid by c51_tile_rows: a larger value than the
    kernel's C51_TILE_ROWS would leave rows unprocessed."""
    pytest.importorskip("cupy", reason="cupy is not installed")
    from service.backend.cuda import c51

    source = tmp_path / "tile_rows.cu"
    source.write_text(TILE_ROWS_PROGRAM)
    exe = tmp_path / "tile_rows"
    cmd = [nvcc, "-std=c++17", "-arch=sm_90", "-I", str(KERNELS), f"-DTRIDENT_H={H}",
           f"-DTRIDENT_Z={Z}", str(source), "-o", str(exe)]  # fmt: skip
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert int(ran.stdout) == c51.c51_tile_rows(H, Z)
