"""Philox4x32-10, the counter-based generator every random draw in Trident comes from.

A draw is a pure function of (key, counter): no generator state to carry, checkpoint or
share between threads, and a CUDA kernel computes the same bits from the same counter
(Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11).

Trident keys every draw with the run seed and a 4-word counter
`(index, sequence, stream, 0)`: `stream` names what the draw is for, `sequence` is the
update or call it belongs to, `index` is the element (sample, env) within it.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
_MASK32 = 0xFFFFFFFF
ROUNDS = 10


class Stream(IntEnum):
    """What a draw is for; each stream gets counters no other stream uses."""

    MINIBATCH = 1  # PPO minibatch permutation keys, one per rollout sample
    REPLAY = 2  # replay sample indices, one per Q-batch row
    ACT_SAMPLE = 3  # categorical sampling in Act, one per observation
    ACT_EXPLORE = 4  # epsilon coin and random action in Act
    LOB_RESET = 5  # LobSim: initial books and per-env flow weights, one per env
    LOB_FLOW = 6  # LobSim: background events, one per env
    LOB_LATENCY = 7  # LobSim: the agent's random latency, one per env
    LOB_INFORMED = 8  # LobSim: informed flow's hidden direction and coins, one per env


def philox4x32(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of `counter` ([..., 4] uint32) under `key` -> [..., 4] uint32."""
    c = np.asarray(counter, dtype=np.uint32)
    if c.shape[-1:] != (4,):
        raise ValueError(f"counter: expected shape [..., 4], got {list(c.shape)}")
    c0, c1, c2, c3 = (c[..., i].astype(np.uint64) for i in range(4))
    k0, k1 = np.uint64(key[0] & _MASK32), np.uint64(key[1] & _MASK32)
    m0, m1, mask = np.uint64(_M0), np.uint64(_M1), np.uint64(_MASK32)
    shift = np.uint64(32)
    for _ in range(ROUNDS):
        p0 = m0 * c0  # 32x32 -> 64-bit products, exact in uint64
        p1 = m1 * c2
        c0, c1, c2, c3 = (
            (p1 >> shift) ^ c1 ^ k0,
            p1 & mask,
            (p0 >> shift) ^ c3 ^ k1,
            p0 & mask,
        )
        k0 = (k0 + np.uint64(_W0)) & mask
        k1 = (k1 + np.uint64(_W1)) & mask
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def seed_key(seed: int) -> tuple[int, int]:
    """The Philox key of a run seed (a non-negative int of up to 64 bits)."""
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed: expected an integer in [0, 2**64), got {seed}")
    return seed & _MASK32, seed >> 32


def random_bits(key: tuple[int, int], stream: Stream, sequence: int, n: int) -> np.ndarray:
    """Four uint32 draws [n, 4] for each element 0..n-1 of `sequence` in `stream`."""
    return random_bits_span(key, stream, sequence, 1, n)[0]


def random_bits_span(
    key: tuple[int, int], stream: Stream, first: int, count: int, n: int
) -> np.ndarray:
    """`random_bits` of sequences first .. first + count - 1 in one pass: [count, n, 4]."""
    sequences = np.arange(first, first + count, dtype=np.uint64)
    counter = np.zeros((count, n, 4), dtype=np.uint32)
    counter[:, :, 0] = np.arange(n, dtype=np.uint32)
    counter[:, :, 1] = (sequences & np.uint64(_MASK32)).astype(np.uint32)[:, None]
    counter[:, :, 2] = np.uint32(int(stream))
    counter[:, :, 3] = (sequences >> np.uint64(32)).astype(np.uint32)[:, None]
    return philox4x32(counter, key)


def uniform01(bits: np.ndarray, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """Map uint32 draws to [0, 1) using their top 24 bits, exact in float32 and float64."""
    return ((bits >> np.uint32(8)).astype(np.float64) * 2.0**-24).astype(dtype)


def below(bits: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """Map uint32 draws to integers in [0, n) by multiply-shift (bias < n / 2**32)."""
    return ((bits.astype(np.uint64) * np.uint64(n)) >> np.uint64(32)).astype(np.int64)
