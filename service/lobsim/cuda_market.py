"""LobSim's market step on the GPU (kernels/lobsim.cu), for `LobSim(..., backend="cuda")`.

The kernel runs each market's step in one thread — the agent's messages at their latency slot
and the background events — with the NumPy engine's integer arithmetic, so one seed gives the
same books on both. For now the environment around it (actions to messages, latency draws,
observation, reward, liquidation, resets) stays in NumPy: the market state goes to the device
and back once per step.
"""

from __future__ import annotations

import numpy as np

from service.backend.cuda.loader import load_kernel
from service.lobsim.book import Books, Messages

BLOCK = 128


class CudaMarket:
    """Runs `lobsim_step` over the host `Books` state of N markets."""

    def __init__(self, books: Books, visible_levels: int) -> None:
        import cupy

        self._cupy = cupy
        self._kernel = load_kernel(
            "lobsim.cu",
            "lobsim_step",
            {"TRIDENT_LOB_P": books.price_levels, "TRIDENT_LOB_D": visible_levels},
        )

    def step(
        self,
        books: Books,
        messages: list[Messages],
        latency: np.ndarray,
        weights: tuple[np.ndarray, np.ndarray, np.ndarray],
        excitation: np.ndarray,
        key: tuple[int, int],
        first_seq: int,
        events: int,
        flow_settings: tuple[int, bool, int, int],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step's events on the device; updates `books` and `excitation` in place and
        returns the agent's taken and passive lots and the signed flow per market."""
        cp, N = self._cupy, books.num_envs
        limit_w, cancel_w, market_w = weights
        max_order_lots, hawkes, jump, decay_pct = flow_settings
        state = [
            cp.asarray(a)
            for a in (books.lots, books.agent_px, books.agent_qty, books.agent_ahead,
                      books.inventory, books.cash, books.overflow, books.traded)
        ]  # fmt: skip
        fields = ("kind", "side", "owner", "price", "qty", "position")
        msg = np.stack([np.stack([getattr(m, f) for f in fields]) for m in messages])
        device_excitation = cp.asarray(excitation)
        outputs = [cp.zeros(N, dtype=cp.int64) for _ in range(3)]
        self._kernel(
            (-(-N // BLOCK),),
            (BLOCK,),
            (
                *state,
                cp.asarray(books.base),
                cp.asarray(np.ascontiguousarray(limit_w)),
                cp.asarray(cancel_w),
                cp.asarray(market_w),
                device_excitation,
                cp.asarray(np.ascontiguousarray(msg, dtype=np.int64)),
                cp.asarray(latency.astype(np.int64)),
                *outputs,
                cp.asarray(np.array(key, dtype=np.uint32)),
                np.int64(first_seq),
                np.int32(events),
                np.int32(max_order_lots),
                np.int32(int(hawkes)),
                np.int64(jump),
                np.int64(decay_pct),
                np.int64(N),
            ),
        )
        targets = (books.lots, books.agent_px, books.agent_qty, books.agent_ahead,
                   books.inventory, books.cash, books.overflow, books.traded)  # fmt: skip
        for host, device in zip(targets, state, strict=True):
            host[...] = device.get()
        excitation[...] = device_excitation.get()
        taken, passive, flow = (o.get() for o in outputs)
        return taken, passive, flow
