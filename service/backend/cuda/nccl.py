"""The Communicator over NCCL, through CuPy's binding: one rank per GPU, its collectives queued
on the current stream (so a CUDA graph captures them with the update around them).

Determinism: NCCL picks its algorithm and protocol by message size and topology, and a sum
adds in the order that algorithm visits the ranks. `pin_nccl_environment` fixes both
(NCCL_ALGO=Ring, NCCL_PROTO=Simple) before the communicator exists, so two runs on the same
machines reduce in the same order and give the same bytes.

Deadlines: a collective is queued, not waited for. `wait` (the trainer calls it where it
reads the device back, and `barrier` always) polls the stream until the deadline, then aborts
the communicator and raises CollectiveTimeout, so a dead rank never hangs the others; NCCL's
own asynchronous errors are raised there too.
"""

from __future__ import annotations

import os
import time
from collections.abc import MutableMapping
from dataclasses import dataclass

import cupy
from cupy.cuda import nccl

from service.backend.comm import DEFAULT_DEADLINE_S, CollectiveTimeout, check_root
from service.backend.rendezvous import Topology, share
from service.errors import InvalidInput

DETERMINISTIC = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
POLL_S = 0.001


def pin_nccl_environment(env: MutableMapping[str, str] = os.environ) -> None:
    """Fix NCCL's algorithm and protocol (read when a communicator is made); a different value
    already set is an error, since it would make reductions vary between runs."""
    for name, value in DETERMINISTIC.items():
        if env.get(name, value) != value:
            raise InvalidInput(name, f"{value!r} (Trident pins it for deterministic sums)",
                               repr(env[name]))  # fmt: skip
        env[name] = value


def unique_id_bytes() -> bytes:
    uid = nccl.get_unique_id()
    return bytes(uid) if isinstance(uid, bytes | bytearray) else bytes(v % 256 for v in uid)


class NcclRank:
    """One rank of an NCCL communicator on the current device."""

    def __init__(
        self, rank: int, world_size: int, unique_id: bytes, deadline_s: float = DEFAULT_DEADLINE_S
    ) -> None:
        """Join the communicator `unique_id` names (rank 0 made it: `unique_id_bytes`) as
        `rank` on the current device; returns once every rank has joined."""
        if not nccl.available:
            raise InvalidInput("nccl", "the NCCL runtime (pip install 'trident[cuda]')",
                               "none found by CuPy")  # fmt: skip
        pin_nccl_environment()
        self.rank, self.world_size, self.deadline_s = rank, world_size, deadline_s
        self._comm = nccl.NcclCommunicator(world_size, unique_id, rank)

    @classmethod
    def connect(cls, topology: Topology, deadline_s: float = DEFAULT_DEADLINE_S) -> NcclRank:
        """Rank `topology.rank`, rank 0's unique id handed over at the rendezvous address."""
        uid = share(topology, unique_id_bytes() if topology.rank == 0 else None, deadline_s)
        return cls(topology.rank, topology.world_size, uid, deadline_s)

    def _type(self, buffer: cupy.ndarray) -> int:
        if not isinstance(buffer, cupy.ndarray) or not buffer.flags.c_contiguous:
            raise InvalidInput("buffer", "a C-contiguous CuPy array", type(buffer).__name__)
        kinds = {"float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64}
        if buffer.dtype.name not in kinds:
            raise InvalidInput("buffer", "float32 or float64", str(buffer.dtype))
        return kinds[buffer.dtype.name]

    def all_reduce_sum(self, buffer: cupy.ndarray) -> None:
        kind, stream = self._type(buffer), cupy.cuda.get_current_stream().ptr
        ptr = buffer.data.ptr
        self._comm.allReduce(ptr, ptr, buffer.size, kind, nccl.NCCL_SUM, stream)

    def broadcast(self, buffer: cupy.ndarray, root: int = 0) -> None:
        check_root(root, self.world_size)
        kind, stream = self._type(buffer), cupy.cuda.get_current_stream().ptr
        ptr = buffer.data.ptr
        self._comm.broadcast(ptr, ptr, buffer.size, kind, root, stream)

    def barrier(self) -> None:
        token = cupy.zeros(1, dtype=cupy.float32)
        self.all_reduce_sum(token)
        self.wait("barrier")

    def wait(self, what: str = "a collective") -> None:
        """Wait for the current stream's work, collectives included, within the deadline."""
        event = cupy.cuda.get_current_stream().record()
        deadline = time.monotonic() + self.deadline_s
        while not event.done:
            self._comm.check_async_error()
            if time.monotonic() > deadline:
                self._comm.abort()
                raise CollectiveTimeout(
                    f"rank {self.rank} of {self.world_size}: {what} did not complete within "
                    f"{self.deadline_s:g} s (a rank died or stalled; the communicator is aborted)"
                )
            time.sleep(POLL_S)
        self._comm.check_async_error()

    def close(self) -> None:
        self._comm.destroy()


@dataclass(frozen=True)
class NcclGroup:
    """The GPUs of one host as the ranks of one communicator: made by rank 0's process before
    it starts the others, passed to each; there `communicator(rank)` takes GPU `rank`."""

    world_size: int
    unique_id: bytes

    @classmethod
    def create(cls, world_size: int) -> NcclGroup:
        devices = cupy.cuda.runtime.getDeviceCount()
        if not 1 <= world_size <= devices:
            raise InvalidInput("--gpus", f"a number of GPUs in [1, {devices}]", str(world_size))
        return cls(world_size, unique_id_bytes())

    def communicator(self, rank: int, deadline_s: float = DEFAULT_DEADLINE_S) -> NcclRank:
        cupy.cuda.Device(rank).use()
        return NcclRank(rank, self.world_size, self.unique_id, deadline_s)

    def close(self) -> None:
        """Nothing to free: each rank's communicator goes with its process."""
