"""Ring buffer of n-step transitions for the off-policy C51 head, sampled with Philox."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from service.backend.comm import Communicator
from service.errors import InvalidInput
from service.types import Transitions

FIELDS = ("obs", "actions", "rewards", "dones", "horizons", "next_obs")


class ReplayBuffer:
    """Fixed-capacity FIFO rings, one per data shard held (train.data_shards): the oldest
    transitions are overwritten first. Ring j holds rows [j·C, (j+1)·C) of the storage, C =
    capacity / shards; every Step gives each ring as many rows, so the rings share their
    counters.

    `position` (next slot to write in each ring) and `size` (rows in each ring) are host
    counters; `size_on_device` mirrors `size` in the backend's memory, where the sampler
    (`replay_sample_indices`) reads it.
    """

    def __init__(
        self, capacity: int, obs_dim: int, dtype: np.dtype, xp: ModuleType = np, shards: int = 1
    ) -> None:
        if capacity % shards:
            raise InvalidInput("replay capacity", f"a multiple of {shards} shards", str(capacity))
        self.capacity = capacity // shards  # of each ring
        self.shards = shards
        self.xp = xp
        self.storage = {
            "obs": xp.zeros((capacity, obs_dim), dtype=dtype),
            "actions": xp.zeros(capacity, dtype=np.int32),
            "rewards": xp.zeros(capacity, dtype=dtype),
            "dones": xp.zeros(capacity, dtype=np.uint8),
            "horizons": xp.zeros(capacity, dtype=np.int32),
            "next_obs": xp.zeros((capacity, obs_dim), dtype=dtype),
        }  # capacity: every ring's rows
        self.position = np.zeros(1, dtype=np.int64)
        self.size = np.zeros(1, dtype=np.int64)
        self.size_on_device = xp.zeros(1, dtype=np.int64)

    def __len__(self) -> int:
        """Rows held, over every ring."""
        return int(self.size[0]) * self.shards

    def insert(
        self, batch: Transitions, valid: np.ndarray | None = None, columns: int = 1
    ) -> tuple[int, int]:
        """Write the batch in order at the rings' position, wrapping around: the rows of a
        time-major [T, columns] batch go to the ring of their column's block. With `valid` (a
        device bool [1]) false, every slot keeps its old row: the caller then learns so from
        its readback and `undo`es the counters. Returns the counters before the insert."""
        before = int(self.position[0]), int(self.size[0])
        if self.shards > 1:
            block = columns // self.shards
            column = self.xp.arange(batch.actions.shape[0]) % columns
            for ring in range(self.shards):
                mine = self.xp.flatnonzero(column // block == ring)
                part = Transitions(*(getattr(batch, name)[mine] for name in FIELDS))
                self._write(part, valid, before, ring * self.capacity)
        else:
            self._write(batch, valid, before, 0)
        count = min(self.capacity, batch.actions.shape[0] // self.shards)
        self.position[0] = (before[0] + count) % self.capacity
        self.size[0] = min(self.capacity, before[1] + count)
        self.size_on_device.fill(int(self.size[0]))
        return before

    def _write(
        self, batch: Transitions, valid: np.ndarray | None, before: tuple[int, int], base: int
    ) -> None:
        """One ring's rows, at slots base + (position + i) mod capacity."""
        count = batch.actions.shape[0]
        if count > self.capacity:  # only the newest `capacity` transitions would survive
            keep = slice(count - self.capacity, count)
            batch = Transitions(*(getattr(batch, name)[keep] for name in FIELDS))
            count = self.capacity
        xp = self.xp
        slots = base + (xp.arange(count) + before[0]) % self.capacity
        for name in FIELDS:
            rows = xp.asarray(getattr(batch, name))
            if valid is not None:
                rows = xp.where(valid.reshape((1,) * rows.ndim), rows, self.storage[name][slots])
            self.storage[name][slots] = rows

    def undo(self, before: tuple[int, int]) -> None:
        """Put back the counters `insert` returned (its rows were left unwritten)."""
        self.position[0], self.size[0] = before
        self.size_on_device.fill(before[1])

    def _filled(self, size: int) -> list[slice]:
        return [slice(j * self.capacity, j * self.capacity + size) for j in range(self.shards)]

    def state(self) -> dict[str, np.ndarray]:
        """Each ring's stored rows [0, size), ring after ring, of each field, plus position
        and size (of each ring)."""
        filled = self._filled(int(self.size[0]))
        state = {name: self._rows(self.storage[name], filled) for name in FIELDS}
        return {**state, "position": self.position, "size": self.size}

    def _rows(self, array: np.ndarray, filled: list[slice]) -> np.ndarray:
        if len(filled) == 1:
            return array[filled[0]]
        return self.xp.concatenate([array[part] for part in filled])

    def gathered_state(self, shards: int, comm: Communicator) -> dict:
        """`state()` of all `shards` rings, ring after ring, from the ranks holding them (rank
        r holds the r-th equal part, in order): a collective, each rank broadcasting its rows
        in turn, as float64 (exact for every field) so that no value is summed."""
        size, xp = int(self.size[0]), self.xp
        mine = self.state()
        gathered: dict[str, np.ndarray] = {}
        for name in FIELDS:
            block = (self.shards * size, *mine[name].shape[1:])
            full = xp.empty((shards * size, *block[1:]), dtype=mine[name].dtype)
            for rank in range(comm.world_size):
                rows = (mine[name].astype(np.float64) if rank == comm.rank
                        else xp.empty(block, dtype=np.float64))  # fmt: skip
                comm.broadcast(rows, root=rank)
                full[rank * block[0] : (rank + 1) * block[0]] = rows.astype(full.dtype)
            gathered[name] = full
        return {**gathered, "position": self.position, "size": self.size}

    def load_state(self, state: dict[str, np.ndarray], first_ring: int = 0) -> None:
        """Inverse of `state()`, or of `gathered_state()` keeping this trainer's rings (from
        `first_ring` on); the arrays must already have been checked by the caller."""
        filled = int(state["size"][0])
        if not 0 <= filled <= self.capacity:
            raise InvalidInput("replay/size", f"an integer in [0, {self.capacity}]", filled)
        for name in FIELDS:
            rows = self.xp.asarray(state[name])
            self.storage[name][...] = 0
            for j, part in enumerate(self._filled(filled)):
                ring = first_ring + j
                self.storage[name][part] = rows[ring * filled : (ring + 1) * filled]
        self.position[:] = state["position"]
        self.size[:] = filled
        self.size_on_device.fill(filled)
