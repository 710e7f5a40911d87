"""Collectives between the ranks of a data-parallel trainer: one rank per device, each holding
the whole model, each computing gradients on its share of a Step's rollout.

A `Communicator` sums one flat buffer over the ranks (in place, in an order fixed by the
implementation, so every rank gets the same bytes, run after run), broadcasts a buffer from
one rank, and waits for all ranks at a barrier. Every collective has a deadline: a rank that
died or stalled makes the others raise `CollectiveTimeout` instead of hanging. One rank's
code is the same whatever carries the bytes: `SingleRank` (world size 1: nothing to
exchange), `SharedMemoryGroup` (processes of one host over shared memory: the NumPy backend
and the CPU tests) and, on GPUs, NCCL (`service.backend.cuda.nccl`).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from multiprocessing import shared_memory
from multiprocessing.context import BaseContext
from multiprocessing.synchronize import Barrier
from typing import Any, Protocol

import numpy as np

from service.errors import InvalidInput, TridentError

DEFAULT_DEADLINE_S = 60.0


class CollectiveTimeout(TridentError):
    """A collective did not complete within its deadline: a rank died or stalled."""


class Communicator(Protocol):
    rank: int
    world_size: int

    def all_reduce_sum(self, buffer: Any) -> None:
        """Replace `buffer` on every rank by the sum over ranks, the same bytes on each."""
        ...

    def broadcast(self, buffer: Any, root: int = 0) -> None:
        """Replace `buffer` on every rank by rank `root`'s."""
        ...

    def barrier(self) -> None:
        """Return once every rank has called it."""
        ...


class SingleRank:
    """World size 1: every collective is the identity."""

    rank, world_size = 0, 1

    def all_reduce_sum(self, buffer: Any) -> None:
        pass

    def broadcast(self, buffer: Any, root: int = 0) -> None:
        check_root(root, 1)

    def barrier(self) -> None:
        pass


def check_root(root: int, world_size: int) -> None:
    if type(root) is not int or not 0 <= root < world_size:
        raise InvalidInput("root", f"a rank in [0, {world_size})", repr(root))


@dataclass(frozen=True)
class SharedMemoryGroup:
    """What the ranks of one host share, made by the parent before it starts them: a shared
    segment with one slot of `slot_bytes` per rank, and a barrier. Pass it to each rank's
    process; there `communicator(rank)` joins it."""

    name: str
    world_size: int
    slot_bytes: int
    gate: Barrier

    @classmethod
    def create(cls, context: BaseContext, world_size: int, slot_bytes: int) -> SharedMemoryGroup:
        if type(world_size) is not int or world_size < 1:
            raise InvalidInput("world_size", "an integer >= 1", repr(world_size))
        if type(slot_bytes) is not int or slot_bytes < 8:
            raise InvalidInput("slot_bytes", "an integer >= 8", repr(slot_bytes))
        segment = shared_memory.SharedMemory(create=True, size=world_size * slot_bytes)
        group = cls(segment.name, world_size, slot_bytes, context.Barrier(world_size))
        _OWNED[group.name] = segment  # the creator unlinks it (`close`)
        return group

    def communicator(self, rank: int, deadline_s: float = DEFAULT_DEADLINE_S) -> SharedMemoryRank:
        return SharedMemoryRank(self, rank, deadline_s)

    def close(self) -> None:
        """Free the segment (the creating process, once every rank is done)."""
        segment = _OWNED.pop(self.name, None)
        if segment is not None:
            segment.close()
            segment.unlink()


_OWNED: dict[str, shared_memory.SharedMemory] = {}


def _attach(name: str) -> shared_memory.SharedMemory:
    """The segment `name`, opened by a rank the creating process started: before Python 3.13
    opening registers the segment with the resource tracker the rank shares with its creator,
    which holds each name once, and the creator's `close` unregisters it."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    return shared_memory.SharedMemory(name=name)


class SharedMemoryRank:
    """One rank of a SharedMemoryGroup. A collective writes this rank's slot, waits for every
    rank, reads the slots it needs, and waits again before a slot may be written anew. The
    sum adds the slots in rank order: every rank computes the same bytes."""

    def __init__(self, group: SharedMemoryGroup, rank: int, deadline_s: float) -> None:
        if type(rank) is not int or not 0 <= rank < group.world_size:
            raise InvalidInput("rank", f"an integer in [0, {group.world_size})", repr(rank))
        if not deadline_s > 0:
            raise InvalidInput("deadline_s", "a positive number of seconds", repr(deadline_s))
        self.group, self.rank, self.world_size = group, rank, group.world_size
        self.deadline_s = deadline_s
        self._segment = _attach(group.name)
        self._lock = threading.Lock()  # one collective at a time from this rank

    def _slot(self, rank: int, like: np.ndarray) -> np.ndarray:
        return np.ndarray(like.shape, like.dtype, self._segment.buf, rank * self.group.slot_bytes)

    def _fits(self, buffer: np.ndarray) -> np.ndarray:
        if not isinstance(buffer, np.ndarray) or not buffer.flags.c_contiguous:
            raise InvalidInput("buffer", "a C-contiguous NumPy array", type(buffer).__name__)
        if buffer.nbytes > self.group.slot_bytes:
            raise InvalidInput(
                "buffer", f"at most {self.group.slot_bytes} bytes (the group's slot size)",
                f"{buffer.nbytes} bytes",
            )  # fmt: skip
        return buffer

    def _wait(self, what: str) -> None:
        try:
            self.group.gate.wait(self.deadline_s)
        except threading.BrokenBarrierError:
            raise CollectiveTimeout(
                f"rank {self.rank} of {self.world_size}: {what} did not complete within "
                f"{self.deadline_s:g} s (a rank died or stalled; every rank stops)"
            ) from None

    def all_reduce_sum(self, buffer: Any) -> None:
        buffer = self._fits(buffer)
        with self._lock:
            self._slot(self.rank, buffer)[...] = buffer
            self._wait("all_reduce_sum")
            total = self._slot(0, buffer).copy()
            for rank in range(1, self.world_size):
                total += self._slot(rank, buffer)
            self._wait("all_reduce_sum")
            buffer[...] = total

    def broadcast(self, buffer: Any, root: int = 0) -> None:
        buffer = self._fits(buffer)
        check_root(root, self.world_size)
        with self._lock:
            if self.rank == root:
                self._slot(root, buffer)[...] = buffer
            self._wait("broadcast")
            if self.rank != root:
                buffer[...] = self._slot(root, buffer)
            self._wait("broadcast")

    def barrier(self) -> None:
        with self._lock:
            self._wait("barrier")

    def close(self) -> None:
        self._segment.close()
