"""Ring buffer of n-step transitions for the off-policy C51 head, sampled with Philox."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from service.errors import InvalidInput
from service.types import Transitions

FIELDS = ("obs", "actions", "rewards", "dones", "horizons", "next_obs")


class ReplayBuffer:
    """Fixed-capacity FIFO ring; the oldest transitions are overwritten first.

    `position` (next slot to write) and `size` are host counters; `size_on_device` mirrors
    `size` in the backend's memory, where the sampler (`replay_sample_indices`) reads it.
    """

    def __init__(self, capacity: int, obs_dim: int, dtype: np.dtype, xp: ModuleType = np) -> None:
        self.capacity = capacity
        self.xp = xp
        self.storage = {
            "obs": xp.zeros((capacity, obs_dim), dtype=dtype),
            "actions": xp.zeros(capacity, dtype=np.int32),
            "rewards": xp.zeros(capacity, dtype=dtype),
            "dones": xp.zeros(capacity, dtype=np.uint8),
            "horizons": xp.zeros(capacity, dtype=np.int32),
            "next_obs": xp.zeros((capacity, obs_dim), dtype=dtype),
        }
        self.position = np.zeros(1, dtype=np.int64)
        self.size = np.zeros(1, dtype=np.int64)
        self.size_on_device = xp.zeros(1, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.size[0])

    def insert(self, batch: Transitions, valid: np.ndarray | None = None) -> tuple[int, int]:
        """Write the batch in order at the ring position, wrapping around. With `valid` (a
        device bool [1]) false, every slot keeps its old row: the caller then learns so from
        its readback and `undo`es the counters. Returns the counters before the insert."""
        before = int(self.position[0]), int(self.size[0])
        count = batch.actions.shape[0]
        if count > self.capacity:  # only the newest `capacity` transitions would survive
            keep = slice(count - self.capacity, count)
            batch = Transitions(*(getattr(batch, name)[keep] for name in FIELDS))
            count = self.capacity
        xp = self.xp
        slots = (xp.arange(count) + before[0]) % self.capacity
        for name in FIELDS:
            rows = xp.asarray(getattr(batch, name))
            if valid is not None:
                rows = xp.where(valid.reshape((1,) * rows.ndim), rows, self.storage[name][slots])
            self.storage[name][slots] = rows
        self.position[0] = (before[0] + count) % self.capacity
        self.size[0] = min(self.capacity, before[1] + count)
        self.size_on_device.fill(int(self.size[0]))
        return before

    def undo(self, before: tuple[int, int]) -> None:
        """Put back the counters `insert` returned (its rows were left unwritten)."""
        self.position[0], self.size[0] = before
        self.size_on_device.fill(before[1])

    def state(self) -> dict[str, np.ndarray]:
        """The stored rows [0, size) of each field, plus position and size."""
        filled = int(self.size[0])
        state = {name: self.storage[name][:filled] for name in FIELDS}
        return {**state, "position": self.position, "size": self.size}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of `state()`; the arrays must already have been checked by the caller."""
        filled = int(state["size"][0])
        if not 0 <= filled <= self.capacity:
            raise InvalidInput("replay/size", f"an integer in [0, {self.capacity}]", filled)
        for name in FIELDS:
            self.storage[name][:filled] = self.xp.asarray(state[name])
            self.storage[name][filled:] = 0
        self.position[:] = state["position"]
        self.size[:] = filled
        self.size_on_device.fill(filled)
