"""kernels/lobsim.cu built as host C++ (g++ with shims for the CUDA keywords), run one market
after another: a `MarketKernel` for LobSim on NumPy books, so the kernel's integer logic is
checked against the NumPy engine on machines with no GPU. Each thread of the kernel only reads
and writes its own market, so running the markets in turn is what the GPU computes."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from service.backend.philox import Stream, random_bits
from service.lobsim.book import Books, Messages

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
FIELDS = ("kind", "side", "owner", "price", "qty", "position")  # cuda_market.FIELDS

SHIM = """
#include <cstdint>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
struct uint2 { unsigned int x, y; };
struct uint4 { unsigned int x, y, z, w; };
static inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
    return {a, b, c, d};
}
struct host_dim3 { unsigned int x = 0, y = 0, z = 0; };
static host_dim3 blockIdx, threadIdx, blockDim, gridDim;
static inline void __syncthreads() {}
"""

DRIVER = """
#include "lobsim.cu"
extern "C" void host_lobsim_step(
    long long* lots, long long* agent_px, long long* agent_qty, long long* agent_ahead,
    long long* inventory, long long* cash, long long* overflow, long long* traded,
    const long long* base, const long long* limit_w, const long long* cancel_w,
    const long long* market_w, long long* excitation, long long* direction,
    const long long* msg, const long long* latency, long long* taken, long long* passive,
    long long* flow, const unsigned int* key, long long first_seq, int events,
    int max_order_lots, int hawkes, long long hawkes_jump, long long hawkes_decay_pct,
    int informed_pct, int flip_permille, long long N) {
    blockDim.x = 1;
    gridDim.x = (unsigned)N;
    for (long long n = 0; n < N; ++n) {
        blockIdx.x = (unsigned)n;
        lobsim_step(lots, agent_px, agent_qty, agent_ahead, inventory, cash, overflow, traded,
                    base, limit_w, cancel_w, market_w, excitation, direction, msg, latency,
                    taken, passive, flow, key, first_seq, events, max_order_lots, hawkes,
                    hawkes_jump, hawkes_decay_pct, informed_pct, flip_permille, N);
    }
}
"""


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def build(price_levels: int, visible_levels: int, folder: Path) -> ctypes.CDLL:
    """The kernel for P price levels and D visible levels as a shared library in `folder`."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++, or $CXX)")
    (folder / "shim.h").write_text(SHIM)
    driver = folder / "driver.cpp"
    driver.write_text(DRIVER)
    library = folder / f"lobsim_P{price_levels}_D{visible_levels}.so"
    command = [cxx, "-O1", "-std=c++17", "-shared", "-fPIC", "-Wno-unknown-pragmas",
               "-include", str(folder / "shim.h"), f"-I{KERNELS}",
               f"-DTRIDENT_LOB_P={price_levels}", f"-DTRIDENT_LOB_D={visible_levels}",
               str(driver), "-o", str(library)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(library))
    lib.host_lobsim_step.restype = None
    return lib


class HostMarket:
    """CudaMarket's interface (service/lobsim/cuda_market.py) over NumPy books, by the
    host-built kernel; its random bits are NumPy's Philox words."""

    def __init__(self, lib: ctypes.CDLL, key: tuple[int, int]) -> None:
        self._lib, self._key = lib, key
        self._key_words = np.array(key, dtype=np.uint32)

    def random_bits(self, stream: Stream, sequence: int, n: int) -> np.ndarray:
        return random_bits(self._key, stream, sequence, n)

    def step(
        self,
        books: Books,
        messages: list[Messages],
        latency: np.ndarray,
        weights: tuple[np.ndarray, np.ndarray, np.ndarray],
        excitation: np.ndarray,
        direction: np.ndarray,
        first_seq: int,
        events: int,
        flow_settings: tuple[int, bool, int, int, int, int],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        N = books.num_envs
        max_order_lots, hawkes, jump, decay_pct, informed_pct, flip_permille = flow_settings
        msg = np.ascontiguousarray(
            np.stack([np.stack([getattr(m, f) for f in FIELDS]) for m in messages]),
            dtype=np.int64,
        )
        limit_w, cancel_w, market_w = (np.ascontiguousarray(w, dtype=np.int64) for w in weights)
        latency = np.ascontiguousarray(latency, dtype=np.int64)
        outputs = [np.zeros(N, dtype=np.int64) for _ in range(3)]
        state = (books.lots, books.agent_px, books.agent_qty, books.agent_ahead,
                 books.inventory, books.cash, books.overflow, books.traded)  # fmt: skip
        for array in (*state, excitation, direction):  # written in place: no copies
            assert array.dtype == np.int64 and array.flags.c_contiguous
        pointer = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        self._lib.host_lobsim_step(
            *map(pointer, state), pointer(books.base), pointer(limit_w), pointer(cancel_w),
            pointer(market_w), pointer(excitation), pointer(direction), pointer(msg),
            pointer(latency), *map(pointer, outputs), pointer(self._key_words),
            ctypes.c_longlong(first_seq), ctypes.c_int(events), ctypes.c_int(max_order_lots),
            ctypes.c_int(int(hawkes)), ctypes.c_longlong(jump), ctypes.c_longlong(decay_pct),
            ctypes.c_int(informed_pct), ctypes.c_int(flip_permille), ctypes.c_longlong(N),
        )  # fmt: skip
        taken, passive, flow = outputs
        return taken, passive, flow
