"""What one rank of tests/test_comm.py does in its own process (spawned: importable by name)."""

from __future__ import annotations

import numpy as np

from service.backend.comm import CollectiveTimeout, SharedMemoryGroup


def reduce_and_broadcast(group: SharedMemoryGroup, rank: int, seed: int, results: object) -> None:
    """All-reduce this rank's fresh buffers (float64 and float32), broadcast from rank 1; put
    (rank, inputs, outputs) on the `results` queue."""
    comm = group.communicator(rank, deadline_s=30)
    rng = np.random.default_rng([seed, rank])
    inputs = [rng.standard_normal(1000), rng.standard_normal((7, 13)).astype(np.float32)]
    outputs = [array.copy() for array in inputs]
    for array in outputs:
        comm.all_reduce_sum(array)
    shared = rng.standard_normal(33)
    comm.broadcast(shared, root=1)
    comm.barrier()
    results.put((rank, inputs, [*outputs, shared]))  # type: ignore[attr-defined]
    comm.close()


def wait_for_a_dead_rank(group: SharedMemoryGroup, rank: int, deadline_s: float,
                         results: object) -> None:  # fmt: skip
    """Join a collective that one rank never joins; report how it ended."""
    comm = group.communicator(rank, deadline_s=deadline_s)
    try:
        comm.all_reduce_sum(np.ones(4))
        results.put((rank, "returned"))  # type: ignore[attr-defined]
    except CollectiveTimeout as error:
        results.put((rank, str(error)))  # type: ignore[attr-defined]
    comm.close()
