"""Compile `kernels/*.cu` with NVRTC (through CuPy) and cache the cubins on disk by content.

Where the sources are: `$TRIDENT_KERNEL_DIR` when set, else the repository's `kernels/`
(`KERNEL_DIR`, three levels above this package: a source checkout or an editable install),
else `<sys.prefix>/share/trident/kernels`, where a wheel installs them (pyproject's
data-files). None found raises `KernelSourceMissing` naming the paths and the variable.

Compile options (`COMPILE_OPTIONS`): C++17, IEEE division and square root, no flush-to-zero,
no fast-math, and `--fmad=false`: no multiply-add is contracted, so every float operation
rounds where NumPy's twin rounds it (kernels that want an FMA call `fmaf` explicitly).
`-I<kernel dir>` makes `#include "common.cuh"` resolve; each define becomes `-DNAME=VALUE`.

The disk cache (`$TRIDENT_KERNEL_CACHE`, default `~/.cache/trident/kernels/`) holds
`<key>.cubin` beside `<key>.cubin.sha256`; `cache_key` hashes every input that can change
the binary (see there). Both files are written atomically (temp file + `os.replace`); a
blob whose sidecar does not match is recompiled. Loaded kernels are also kept in process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from service.errors import BackendUnavailable

if TYPE_CHECKING:
    import cupy

log = logging.getLogger(__name__)

# Bump when a kernel's contract (arguments, layout, semantics) changes; see kernels/CHANGELOG.md.
KERNEL_ABI_VERSION = 8

KERNEL_DIR = Path(__file__).resolve().parents[3] / "kernels"
KERNEL_DIR_ENV = "TRIDENT_KERNEL_DIR"
CACHE_DIR_ENV = "TRIDENT_KERNEL_CACHE"
DEFAULT_CACHE_DIR = Path("~/.cache/trident/kernels")

COMPILE_OPTIONS: tuple[str, ...] = (
    "-std=c++17",
    "--fmad=false",  # no contraction: float32 rounding as in numpy_ops
    "--prec-div=true",  # IEEE round-to-nearest division
    "--prec-sqrt=true",  # IEEE round-to-nearest square root
    "--ftz=false",  # keep denormals (CuPy's own RawModule default is -ftz=true)
)

_FILE_RE = re.compile(r"^[A-Za-z0-9_]+\.cu$")
_DEFINE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class KernelSourceMissing(BackendUnavailable):
    """The kernel sources (`kernels/*.cu`) are not where the loader looks for them."""


class CudaDims(NamedTuple):
    """The model dimensions compiled into the kernels as `TRIDENT_*` defines."""

    D: int  # observation features
    H: int  # hidden width
    A: int  # actions
    Z: int  # C51 atoms
    K: int  # auxiliary regression targets

    def defines(self) -> dict[str, int]:
        """{'TRIDENT_D': D, ...}: the `defines` argument of `load_kernel`."""
        return {f"TRIDENT_{name}": int(value) for name, value in self._asdict().items()}


def kernel_dir() -> Path:
    """The directory holding `*.cu` and `common.cuh`; KernelSourceMissing when absent.

    `$TRIDENT_KERNEL_DIR` if set; else the checkout's `kernels/` (source tree or editable
    install); else `<prefix>/share/trident/kernels`, where a wheel installs them.
    """
    override = os.environ.get(KERNEL_DIR_ENV)
    candidates = [Path(override)] if override else [KERNEL_DIR, installed_kernel_dir()]
    for path in candidates:
        if (path / "common.cuh").is_file():
            return path
    raise KernelSourceMissing(
        f"kernel sources not found at {' or '.join(map(str, candidates))} (no common.cuh); "
        f"reinstall trident or set {KERNEL_DIR_ENV} to a directory holding kernels/*.cu"
    )


def installed_kernel_dir() -> Path:
    """Where `pip install` puts the kernel sources (pyproject's data-files)."""
    return Path(sys.prefix) / "share" / "trident" / "kernels"


def cache_dir() -> Path:
    """Where compiled kernels are kept: `$TRIDENT_KERNEL_CACHE` or ~/.cache/trident/kernels."""
    override = os.environ.get(CACHE_DIR_ENV)
    return Path(override) if override else DEFAULT_CACHE_DIR.expanduser()


def _check_file(file: str) -> None:
    if not _FILE_RE.match(file):
        raise ValueError(f"file: expected a kernel file name like 'gae.cu', got {file!r}")


def _check_defines(defines: Mapping[str, int]) -> dict[str, int]:
    checked: dict[str, int] = {}
    for name, value in defines.items():
        if not _DEFINE_RE.match(name):
            raise ValueError(f"defines: {name!r} is not a C identifier")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"defines[{name!r}]: expected an int, got {value!r}")
        checked[name] = value
    return checked


def define_options(defines: Mapping[str, int]) -> tuple[str, ...]:
    """`-DNAME=VALUE` for each define, sorted by name (the order never changes the key)."""
    return tuple(f"-D{name}={value}" for name, value in sorted(_check_defines(defines).items()))


def toolchain_id() -> str:
    """CuPy's and NVRTC's versions: a new compiler must not reuse an old cubin."""
    import cupy

    try:
        nvrtc = ".".join(str(part) for part in cupy.cuda.nvrtc.getVersion())
    except Exception:  # no libnvrtc: compiling fails later with NVRTC's own message
        nvrtc = "unavailable"
    return f"cupy={cupy.__version__};nvrtc={nvrtc}"


def cache_key(
    file: str,
    options: tuple[str, ...],
    defines: Mapping[str, int],
    arch: str,
    *,
    kernel_root: Path | None = None,
    toolchain: str | None = None,
) -> str:
    """sha256 (hex) naming the binary of `file` built with `options` and `defines` for `arch`.

    Hashed, each length-prefixed: KERNEL_ABI_VERSION, the file name and bytes, the name and
    bytes of every `.cuh` in the kernel directory (any header may be included), the options,
    the sorted defines, the compute capability (e.g. '90') and the toolchain (`toolchain_id`).
    Pure Python; no GPU needed.
    """
    _check_file(file)
    root = kernel_root if kernel_root is not None else kernel_dir()
    digest = hashlib.sha256()

    def feed(label: str, data: bytes) -> None:
        digest.update(f"{label}:{len(data)}:".encode())
        digest.update(data)

    feed("abi", str(KERNEL_ABI_VERSION).encode())
    feed("file", file.encode())
    feed("source", (root / file).read_bytes())
    for header in sorted(root.glob("*.cuh")):
        feed("header", header.name.encode())
        feed("header-bytes", header.read_bytes())
    feed("options", "\0".join(options).encode())
    feed("defines", "\0".join(define_options(defines)).encode())
    feed("arch", arch.encode())
    feed("toolchain", (toolchain if toolchain is not None else toolchain_id()).encode())
    return digest.hexdigest()


def _sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temp file in the same directory and os.replace."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_cached(directory: Path, key: str) -> Path | None:
    """The cubin path for `key` when present and its sidecar sha256 matches, else None."""
    blob_path = directory / f"{key}.cubin"
    sidecar = directory / f"{key}.cubin.sha256"
    try:
        blob = blob_path.read_bytes()
        expected = sidecar.read_text().strip()
    except OSError:
        return None
    if _sha256(blob) != expected:
        log.warning("kernel cache entry %s fails its sha256 check; recompiling", blob_path)
        return None
    return blob_path


def write_cached(directory: Path, key: str, blob: bytes) -> Path:
    """Store `blob` as `<key>.cubin` with its sha256 sidecar (blob first, both atomic)."""
    directory.mkdir(parents=True, exist_ok=True)
    blob_path = directory / f"{key}.cubin"
    _write_atomic(blob_path, blob)
    _write_atomic(directory / f"{key}.cubin.sha256", (_sha256(blob) + "\n").encode())
    return blob_path


def _compile(root: Path, file: str, options: tuple[str, ...], arch: str) -> bytes:
    """NVRTC-compile `root/file` for sm_<arch>; the cubin bytes (PTX if CuPy is set to it)."""
    from cupy.cuda import compiler

    source = (root / file).read_text()
    all_options = (*options, f"--include-path={root}")
    # compile_using_nvrtc: cupy.cuda.compiler's NVRTC entry (CuPy >= 7; returns
    # (binary, name mapping) since CuPy 13). It adds -arch=sm_<arch> and uses no disk cache.
    result = compiler.compile_using_nvrtc(source, all_options, arch=arch, filename=file)
    blob = result[0] if isinstance(result, tuple) else result
    return blob.encode() if isinstance(blob, str) else bytes(blob)


_lock = threading.Lock()
_modules: dict[tuple[int, str], cupy.RawModule] = {}
_kernels: dict[tuple[int, str, str, tuple[tuple[str, int], ...]], cupy.RawKernel] = {}


def _module(file: str, defines: Mapping[str, int]) -> cupy.RawModule:
    import cupy

    root = kernel_dir()
    device = cupy.cuda.Device()
    arch = str(device.compute_capability)
    options = COMPILE_OPTIONS + define_options(defines)
    key = cache_key(file, options, defines, arch, kernel_root=root)
    slot = (device.id, key)
    module = _modules.get(slot)
    if module is not None:
        return module
    directory = cache_dir()
    path = read_cached(directory, key)
    if path is None:
        blob = _compile(root, file, options, arch)
        try:
            path = write_cached(directory, key, blob)
        except OSError as exc:  # read-only or full cache: load from a private temp dir
            log.warning("kernel cache %s not writable (%s); not caching %s", directory, exc, file)
            path = write_cached(Path(tempfile.mkdtemp(prefix="trident-kernels-")), key, blob)
    module = cupy.RawModule(path=str(path))
    _modules[slot] = module
    return module


def clear_loaded() -> None:
    """Forget the modules and kernels loaded in this process; the disk cache stays, so the next
    `load_kernel` reads it, or compiles (e.g. after TRIDENT_KERNEL_CACHE or the sources change
    under a running process)."""
    with _lock:
        _modules.clear()
        _kernels.clear()


def load_kernel(file: str, name: str, defines: Mapping[str, int] | None = None) -> cupy.RawKernel:
    """The `extern "C"` kernel `name` of `kernels/<file>` compiled with `defines`, for the
    current device: from the in-process cache, else the disk cache, else NVRTC."""
    _check_file(file)
    checked = _check_defines(defines or {})
    import cupy

    slot = (cupy.cuda.Device().id, file, name, tuple(sorted(checked.items())))
    with _lock:
        kernel = _kernels.get(slot)
        if kernel is None:
            kernel = _module(file, checked).get_function(name)
            _kernels[slot] = kernel
    return kernel
