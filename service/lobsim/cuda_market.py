"""LobSim's market step on the GPU (kernels/lobsim.cu), for `LobSim(..., backend="cuda")`.

The kernel runs each market's step in one thread — the agent's messages at their latency slot
and the background events — with the NumPy engine's integer arithmetic, so one seed gives the
same books on both. The books live on the device (`Books(..., xp=cupy)`); the environment
around the kernel (actions to messages, observation, reward, liquidation, resets) is the same
code as on the host, in CuPy; the Philox draws of resets and random latencies come from
`lobsim_random_bits`, the device twin of `service.backend.philox.random_bits`. A step uploads
nothing and reads nothing back.
"""

from __future__ import annotations

import cupy
import numpy as np

from service.backend.cuda.loader import load_kernel
from service.backend.philox import Stream
from service.lobsim.book import Books, Messages

BLOCK = 128
FIELDS = ("kind", "side", "owner", "price", "qty", "position")


class CudaMarket:
    """Runs `lobsim_step` over device-resident `Books` of N markets."""

    def __init__(self, books: Books, visible_levels: int, key: tuple[int, int]) -> None:
        if books.xp is not cupy:
            raise ValueError("books: expected device arrays (Books(..., xp=cupy))")
        defines = {"TRIDENT_LOB_P": books.price_levels, "TRIDENT_LOB_D": visible_levels}
        self._kernel = load_kernel("lobsim.cu", "lobsim_step", defines)
        self._bits_kernel = load_kernel("lobsim.cu", "lobsim_random_bits", defines)
        self._key = key
        self._key_on_device = cupy.asarray(np.array(key, dtype=np.uint32))

    def random_bits(self, stream: Stream, sequence: int, n: int) -> cupy.ndarray:
        """Philox words [n, 4] uint32 of `sequence` in `stream`, element i for i < n."""
        out = cupy.empty((n, 4), dtype=cupy.uint32)
        self._bits_kernel(
            (-(-n // BLOCK),),
            (BLOCK,),
            (np.uint32(self._key[0]), np.uint32(self._key[1]), np.uint32(int(stream)),
             np.uint64(sequence), np.int64(n), out),
        )  # fmt: skip
        return out

    def step(
        self,
        books: Books,
        messages: list[Messages],
        latency: cupy.ndarray,
        weights: tuple[cupy.ndarray, cupy.ndarray, cupy.ndarray],
        excitation: cupy.ndarray,
        direction: cupy.ndarray,
        first_seq: int,
        events: int,
        flow_settings: tuple[int, bool, int, int, int, int],
    ) -> tuple[cupy.ndarray, cupy.ndarray, cupy.ndarray]:
        """One step's events; updates `books`, `excitation` and the informed flow's hidden
        `direction` in place and returns the agent's taken and passive lots and the signed
        flow per market. `flow_settings`: (max_order_lots, hawkes, hawkes_jump,
        hawkes_decay_pct, informed_pct, informed_flip_permille)."""
        N = books.num_envs
        limit_w, cancel_w, market_w = weights
        max_order_lots, hawkes, jump, decay_pct, informed_pct, flip_permille = flow_settings
        for name, array in (("excitation", excitation), ("direction", direction)):
            if array.dtype != cupy.int64 or array.shape != (N,) or not array.flags.c_contiguous:
                raise ValueError(f"{name}: expected a contiguous int64 array of shape ({N},), "
                                 f"got {array.dtype} {array.shape}")  # fmt: skip
        msg = cupy.stack([cupy.stack([getattr(m, f) for f in FIELDS]) for m in messages])
        outputs = [cupy.empty(N, dtype=cupy.int64) for _ in range(3)]
        self._kernel(
            (-(-N // BLOCK),),
            (BLOCK,),
            (
                books.lots, books.agent_px, books.agent_qty, books.agent_ahead,
                books.inventory, books.cash, books.overflow, books.traded, books.base,
                cupy.ascontiguousarray(limit_w), cancel_w, market_w, excitation, direction,
                cupy.ascontiguousarray(msg, dtype=cupy.int64), latency, *outputs,
                self._key_on_device, np.int64(first_seq),
                np.int32(events), np.int32(max_order_lots), np.int32(int(hawkes)),
                np.int64(jump), np.int64(decay_pct), np.int32(informed_pct),
                np.int32(flip_permille), np.int64(N),
            ),
        )  # fmt: skip
        taken, passive, flow = outputs
        return taken, passive, flow
