"""Rows on CuPy: the replay ring's uniform draw and gather (kernels/replay.cu), the rollout's
seeded minibatch order (kernels/minibatch.cu) and the minibatch's rows of several arrays in
one launch (replay.cu's gather_rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import cupy
import numpy as np

from service.backend.cuda.launch import BLOCK, Array, KernelOps, strided_blocks
from service.backend.cuda.validate import FLAG_DTYPES as _FLAGS
from service.backend.cuda.validate import I32 as _I32
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import batch as _batch
from service.backend.cuda.validate import count as _count
from service.backend.cuda.validate import counter as _counter
from service.backend.cuda.validate import key as _key
from service.backend.cuda.validate import sequence as _sequence
from service.backend.cuda.validate import sequence_value as _sequence_value

__all__ = ["REPLAY_FIELDS", "ReplayOps"]

GATHER_MAX = 8  # replay.cu: GATHER_MAX arrays per gather_rows launch

# ReplayBuffer's storage fields, in replay.cu's argument order.
REPLAY_FIELDS = ("obs", "actions", "rewards", "dones", "horizons", "next_obs")


class ReplayOps(KernelOps):
    """replay_sample_indices, replay_gather, minibatch_order and gather_rows."""

    def _replay_storage(self, storage: Mapping[str, Array]) -> tuple[int, tuple[Array, ...]]:
        """The ring's arrays in REPLAY_FIELDS order, checked; returns (capacity, arrays)."""
        D = self.dims.D
        missing = [name for name in REPLAY_FIELDS if name not in storage]
        if missing:
            raise ValueError(f"storage: expected fields {list(REPLAY_FIELDS)}, missing {missing}")
        obs, capacity = _batch("storage['obs']", storage["obs"], (D,))
        arrays = (
            obs,
            _array("storage['actions']", storage["actions"], _I32, shape=(capacity,)),
            _array("storage['rewards']", storage["rewards"], shape=(capacity,)),
            _array("storage['dones']", storage["dones"], _FLAGS, shape=(capacity,)),
            _array("storage['horizons']", storage["horizons"], _I32, shape=(capacity,)),
            _array("storage['next_obs']", storage["next_obs"], shape=(capacity, D)),
        )
        return capacity, arrays

    def replay_sample_indices(
        self, size: Array, key: object, sequence: object, count: int
    ) -> Array:
        """`count` slots drawn uniformly with replacement, slot_i = ⌊word0 · size / 2³²⌋ of the
        Philox counter (i, sequence, REPLAY, ·): the replayed rows of an update -> int32
        [count]."""
        size = _counter("size", size)
        count = _count("count", count)
        slots = cupy.empty(count, dtype=cupy.int32)
        self._launch(
            "replay.cu",
            "replay_sample_indices",
            count,
            (size, _key("key", key), _sequence("sequence", sequence), slots, np.int32(count)),
        )
        return slots

    def replay_gather(self, storage: Mapping[str, Array], slots: Array) -> dict[str, Array]:
        """The ring's rows at `slots` (int32 [count], each in [0, size)), one array per field."""
        _, ring = self._replay_storage(storage)
        slots, count = _batch("slots", slots, (), _I32)
        out = {
            name: cupy.empty((count, *array.shape[1:]), dtype=array.dtype)
            for name, array in zip(REPLAY_FIELDS, ring, strict=True)
        }
        self._launch(
            "replay.cu",
            "replay_gather",
            _count("count·D", count * self.dims.D),
            (slots, *ring, *(out[name] for name in REPLAY_FIELDS), np.int32(count)),
        )
        return out

    def minibatch_order(self, key: object, sequence: int, rows: int) -> Array:
        """A seeded permutation of 0 .. rows-1 (int32 [rows]) as numpy_ops.minibatch_order:
        minibatch.cu's unique 64-bit keys, sorted on the device."""
        rows = _count("rows", rows)
        sequence = int(_sequence_value("sequence", sequence))
        keys = cupy.empty(rows, dtype=cupy.uint64)
        self._launch(
            "minibatch.cu",
            "minibatch_keys",
            rows,
            (_key("key", key), np.uint32(sequence & 0xFFFFFFFF), np.uint32(sequence >> 32),
             np.int32(rows), keys),
        )  # fmt: skip
        return cupy.argsort(keys).astype(cupy.int32)

    def gather_rows(self, arrays: Sequence[Array], rows: Array) -> list[Array]:
        """[a[rows] for each array] in one launch (replay.cu): up to GATHER_MAX C-contiguous
        arrays [B_j, ...] of 4-byte elements (float32, int32); rows int32 [n], each in every
        array's [0, B_j) — not checked on the device (the trainer passes its permutation)."""
        arrays = list(arrays)
        if not 1 <= len(arrays) <= GATHER_MAX:
            raise ValueError(f"arrays: expected 1 to {GATHER_MAX} arrays, got {len(arrays)}")
        rows, n = _batch("rows", rows, (), _I32)
        checked = []
        for j, a in enumerate(arrays):
            a = _array(f"arrays[{j}]", a, (np.dtype(np.float32), np.dtype(np.int32)))
            if a.ndim < 1:
                raise ValueError(f"arrays[{j}]: expected at least 1 dimension, got a 0-d array")
            checked.append(a)
        out = [cupy.empty((n, *a.shape[1:]), dtype=a.dtype) for a in checked]
        widths = [int(np.prod(a.shape[1:], dtype=np.int64)) for a in checked]
        pad = GATHER_MAX - len(checked)
        if any(widths):
            self._kernel("replay.cu", "gather_rows")(
                strided_blocks(_count("rows·width", n * max(widths))),
                (BLOCK,),
                (*checked, *[checked[0]] * pad, *out, *[out[0]] * pad,
                 *[np.int32(w) for w in widths], *[np.int32(0)] * pad,
                 np.int32(len(checked)), rows, np.int32(n)),
            )  # fmt: skip
        return out
