"""The wire layout, stated once: which arrays a slot of shared memory holds, in which dtype, shape
and place. The front end writes through these views and the learner reads through the same
ones, built from the few integers that cross the control channel (`RolloutShape`, an Act's row
count), so no array is ever pickled.

Every array starts on a 64-byte boundary (a cache line; NumPy's SIMD loops like it). The fields
of a rollout come in a fixed order whose prefix does not depend on the count of final
observations M: a front end writes a stream's rollout in place while it is assembled and adds
the final observations, known only when the rollout is whole, behind the fixed fields.
"""

from __future__ import annotations

import functools
import mmap
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from service.types import Rollout

ALIGN = 64  # bytes: each array's start
Buffer = mmap.mmap | memoryview | bytearray | bytes  # what arrays are made over


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


@dataclass(frozen=True)
class Field:
    """One array of a slot: `shape` elements of `dtype` at `offset` bytes from the slot's start."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class Layout:
    """Arrays one after another in a slot, each aligned; `nbytes` is the slot space they take."""

    fields: tuple[Field, ...]
    nbytes: int

    @classmethod
    def of(cls, specs: Iterable[tuple[str, str, tuple[int, ...]]]) -> Layout:
        """Place (name, dtype, shape) arrays in order."""
        fields, offset = [], 0
        for name, dtype, shape in specs:
            field = Field(name, np.dtype(dtype), tuple(int(n) for n in shape), _aligned(offset))
            fields.append(field)
            offset = field.offset + field.nbytes
        return cls(tuple(fields), _aligned(offset))

    def views(self, buffer: Buffer, start: int = 0, read_only: tuple[str, ...] = ()
              ) -> dict[str, np.ndarray]:  # fmt: skip
        """Each field as an array over `buffer` at `start` (a slot's first byte); writes through
        a view land in the buffer, except for the fields named `read_only` (the reader's)."""
        views = {}
        for f in self.fields:
            views[f.name] = view = np.ndarray(f.shape, f.dtype, buffer, start + f.offset)
            view.flags.writeable = f.name not in read_only
        return views


# ------------------------------------------------------------------------------------------ Act
ACT_OUT = ("actions", "log_probs", "values")


def act_layout(rows: int, obs_dim: int) -> Layout:
    """An Act slot of `rows` observations: obs in; actions, log π(a|s) and V(s) out. A request of
    fewer rows uses the first rows of each array (the offsets are the capacity's)."""
    return Layout.of([
        ("obs", "<f4", (rows, obs_dim)),
        ("actions", "<i4", (rows,)),
        ("log_probs", "<f4", (rows,)),
        ("values", "<f4", (rows,)),
    ])  # fmt: skip


# -------------------------------------------------------------------------------------- rollouts
@dataclass(frozen=True)
class RolloutShape:
    """What the learner needs to find a rollout's arrays in its slot: T steps of N environments
    of D features, M final observations, whether BCE labels come, K aux targets (0: none)."""

    T: int
    N: int
    D: int
    M: int = 0
    labels: bool = False
    K: int = 0

    PACKED = struct.Struct("<IIIIBI")  # T, N, D, M, labels, K

    def pack(self) -> bytes:
        return self.PACKED.pack(self.T, self.N, self.D, self.M, self.labels, self.K)

    @classmethod
    def unpack(cls, data: Buffer) -> RolloutShape:
        T, N, D, M, labels, K = cls.PACKED.unpack(data)
        return cls(T, N, D, M, bool(labels), K)

    @classmethod
    def of(cls, rollout: Rollout) -> RolloutShape:
        T, D, labels, aux = rollout.layout
        final = rollout.final_obs
        M = 0 if final is None else final.shape[0]
        return cls(T, rollout.num_envs, D, M, labels, aux or 0)

    def with_final(self, M: int) -> RolloutShape:
        return RolloutShape(self.T, self.N, self.D, M, self.labels, self.K)

    def layout(self) -> Layout:
        """The Rollout's fields in its canonical dtypes (those `Rollout.digest` reads): the
        fixed [T, N] arrays first, the M final observations and their flat indices last."""
        return _rollout_layout(self)


@functools.lru_cache(maxsize=256)  # a front end's streams send the same few shapes again
def _rollout_layout(shape: RolloutShape) -> Layout:
    T, N, D = shape.T, shape.N, shape.D
    specs = [
        ("obs", "<f4", (T + 1, N, D)),
        ("actions", "<i4", (T, N)),
        ("behavior_log_probs", "<f4", (T, N)),
        ("rewards", "<f4", (T, N)),
        ("terminated", "?", (T, N)),
        ("truncated", "?", (T, N)),
    ]
    if shape.labels:
        specs.append(("bce_labels", "u1", (T, N)))
    if shape.K:
        specs.append(("aux_targets", "<f4", (T, N, shape.K)))
    specs += [("final_obs_index", "<i8", (shape.M,)), ("final_obs", "<f4", (shape.M, D))]
    return Layout.of(specs)


def write_rollout(views: dict[str, np.ndarray], rollout: Rollout) -> None:
    """Copy a (validated) rollout into a slot's views of its shape. Flags may come as 0/1
    integers, hence `unsafe`: the values are the same."""
    for name, view in views.items():
        value = getattr(rollout, name)
        if value is not None:
            np.copyto(view, value, casting="unsafe")


def read_rollout(views: dict[str, np.ndarray], policy_version: int | None) -> Rollout:
    """The Rollout whose arrays are a slot's views (no copy)."""
    return Rollout(
        obs=views["obs"],
        actions=views["actions"],
        rewards=views["rewards"],
        terminated=views["terminated"],
        truncated=views["truncated"],
        behavior_log_probs=views["behavior_log_probs"],
        final_obs=views["final_obs"],
        final_obs_index=views["final_obs_index"],
        bce_labels=views.get("bce_labels"),
        aux_targets=views.get("aux_targets"),
        policy_version=policy_version,
    )
