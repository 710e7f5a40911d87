"""Philox4x32-10: Random123 known-answer vectors, a plain-Python twin, and the helpers.

Random inputs are fresh each run; the seed is printed (shown on failure) and can be pinned
with TRIDENT_TEST_SEED=<seed>.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.backend.philox import (
    Stream,
    below,
    philox4x32,
    random_bits,
    seed_key,
    uniform01,
)

# Random123 kat_vectors, philox4x32 with 10 rounds: counter (4 words), key (2 words), output.
KAT = [
    ((0x00000000,) * 4, (0x00000000,) * 2, (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def slow_philox(counter: tuple[int, ...], key: tuple[int, int]) -> tuple[int, ...]:
    """Philox4x32-10 in plain Python ints, from Salmon et al. (SC'11)."""
    mask = 0xFFFFFFFF
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & mask, (p0 >> 32) ^ c3 ^ k1, p0 & mask
        k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
    return c0, c1, c2, c3


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_known_answer_vectors(
    counter: tuple[int, ...], key: tuple[int, int], expected: tuple[int, ...]
) -> None:
    out = philox4x32(np.array(counter, dtype=np.uint32), key)
    assert out.dtype == np.uint32 and out.shape == (4,)
    assert [int(w) for w in out] == list(expected)
    assert slow_philox(counter, key) == expected  # the plain-Python twin is right too


def test_batched_matches_plain_python(rng: np.random.Generator) -> None:
    key = (int(rng.integers(2**32)), int(rng.integers(2**32)))
    counters = rng.integers(0, 2**32, size=(3, 5, 4), dtype=np.uint64).astype(np.uint32)
    out = philox4x32(counters, key)
    assert out.shape == (3, 5, 4) and out.dtype == np.uint32
    for idx in np.ndindex(3, 5):
        want = slow_philox(tuple(int(w) for w in counters[idx]), key)
        assert tuple(int(w) for w in out[idx]) == want


def test_counter_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="counter"):
        philox4x32(np.zeros((5, 3), dtype=np.uint32), (0, 0))


def test_seed_key() -> None:
    assert seed_key(0) == (0, 0)
    assert seed_key(0x123456789ABCDEF0) == (0x9ABCDEF0, 0x12345678)
    assert seed_key(2**64 - 1) == (0xFFFFFFFF, 0xFFFFFFFF)
    for bad in (-1, -(2**40), 2**64):
        with pytest.raises(ValueError, match="seed"):
            seed_key(bad)


def test_random_bits_layout(rng: np.random.Generator) -> None:
    key = seed_key(int(rng.integers(2**63)))
    sequence = int(rng.integers(2**40))
    bits = random_bits(key, Stream.REPLAY, sequence, 7)
    assert bits.shape == (7, 4) and bits.dtype == np.uint32
    for i in range(7):
        counter = (i, sequence & 0xFFFFFFFF, int(Stream.REPLAY), sequence >> 32)
        assert tuple(int(w) for w in bits[i]) == slow_philox(counter, key)


def test_streams_sequences_and_keys_give_different_bits(rng: np.random.Generator) -> None:
    key = seed_key(int(rng.integers(2**63)))
    seq, n = int(rng.integers(2**31)), 9
    base = random_bits(key, Stream.MINIBATCH, seq, n)
    np.testing.assert_array_equal(base, random_bits(key, Stream.MINIBATCH, seq, n))  # pure
    variants = [random_bits(key, stream, seq, n) for stream in Stream if stream != Stream.MINIBATCH]
    variants += [
        random_bits(key, Stream.MINIBATCH, seq + 1, n),
        random_bits(key, Stream.MINIBATCH, seq + 2**32, n),  # the high word of the sequence
        random_bits((key[0] ^ 1, key[1]), Stream.MINIBATCH, seq, n),
        random_bits((key[0], key[1] ^ 1), Stream.MINIBATCH, seq, n),
    ]
    for other in variants:
        assert np.mean(other != base) > 0.9
    # Every element of a draw has its own bits, and a longer draw extends a shorter one.
    assert len({tuple(row) for row in base.tolist()}) == n
    np.testing.assert_array_equal(random_bits(key, Stream.MINIBATCH, seq, n + 4)[:n], base)


def test_uniform01_range_and_mean(rng: np.random.Generator) -> None:
    edges = np.array([0, 1, 255, 256, 2**31, 2**32 - 256, 2**32 - 1], dtype=np.uint32)
    for dtype in (np.float32, np.float64):
        u = uniform01(edges, dtype)
        assert u.dtype == dtype
        assert u[0] == 0.0 and np.all(u >= 0) and np.all(u < 1)
        assert u[-1] == 1 - 2.0**-24
    bits = random_bits(seed_key(int(rng.integers(2**63))), Stream.ACT_SAMPLE, 0, 50_000)
    u32, u64 = uniform01(bits, np.float32), uniform01(bits, np.float64)
    np.testing.assert_array_equal(u32.astype(np.float64), u64)  # exact in both dtypes
    assert np.all(u64 >= 0) and np.all(u64 < 1)
    n = u64.size
    assert abs(u64.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
    hist = np.bincount((u64 * 10).astype(np.int64).ravel(), minlength=10)
    assert np.all(np.abs(hist - n / 10) < 5 * np.sqrt(n / 10))


@pytest.mark.parametrize("n", [1, 7, 9, 1000, 2**31 + 11])
def test_below_range_and_uniformity(rng: np.random.Generator, n: int) -> None:
    bits = random_bits(seed_key(int(rng.integers(2**63))), Stream.REPLAY, n, 25_000).ravel()
    k = below(bits, n)
    assert k.dtype == np.int64 and k.min() >= 0 and k.max() < n
    edges = below(np.array([0, 2**32 - 1], dtype=np.uint32), n)
    assert edges[0] == 0 and edges[1] == n - 1
    bins = min(n, 10)
    counts = np.bincount(k * bins // n, minlength=bins)
    expected = k.size / bins
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected) + 1)


def test_below_with_per_element_bounds(rng: np.random.Generator) -> None:
    bits = random_bits(seed_key(int(rng.integers(2**63))), Stream.REPLAY, 3, 5_000)[:, 0]
    bounds = rng.integers(1, 50, size=bits.size)
    k = below(bits, bounds)
    assert np.all(k >= 0) and np.all(k < bounds)
    want = [(int(b) * int(m)) >> 32 for b, m in zip(bits, bounds, strict=True)]
    np.testing.assert_array_equal(k, want)
