"""The ranks of the data-parallel tests: `run_ranks` starts them as spawned processes over a
shared-memory group, and the functions below are what one rank does (spawned processes import
them by name)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable

import numpy as np

from service.backend.comm import CollectiveTimeout, SharedMemoryGroup

SPAWN = multiprocessing.get_context("spawn")


def run_ranks(
    target: Callable[..., None],
    world: int,
    *args: object,
    ranks: Iterable[int] | None = None,
    slot_bytes: int = 1 << 20,
    timeout_s: float = 300.0,
) -> dict[int, object]:
    """Run `target(group, rank, *args, results)` for each of `ranks` (default all of `world`)
    in its own process; what each put on `results` as (rank, value), by rank. A rank may
    stay away (`ranks` without it): the others meet its absence."""
    group = SharedMemoryGroup.create(SPAWN, world, slot_bytes)
    results = SPAWN.Queue()
    chosen = list(range(world) if ranks is None else ranks)
    processes = [SPAWN.Process(target=target, args=(group, rank, *args, results))
                 for rank in chosen]  # fmt: skip
    try:
        for process in processes:
            process.start()
        got = dict(results.get(timeout=timeout_s) for _ in processes)
        for process in processes:
            process.join(30)
    finally:
        for process in processes:
            if process.pid is not None:
                process.kill()
        group.close()
    return got


def reduce_and_broadcast(group: SharedMemoryGroup, rank: int, seed: int, results: object) -> None:
    """All-reduce this rank's fresh buffers (float64 and float32), broadcast from rank 1; put
    (rank, (inputs, outputs)) on the `results` queue."""
    comm = group.communicator(rank, deadline_s=30)
    rng = np.random.default_rng([seed, rank])
    inputs = [rng.standard_normal(1000), rng.standard_normal((7, 13)).astype(np.float32)]
    outputs = [array.copy() for array in inputs]
    for array in outputs:
        comm.all_reduce_sum(array)
    shared = rng.standard_normal(33)
    comm.broadcast(shared, root=1)
    comm.barrier()
    results.put((rank, (inputs, [*outputs, shared])))  # type: ignore[attr-defined]
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


def train_rank(group: SharedMemoryGroup, rank: int, settings: tuple[str, ...],
               rollouts: list, results: object) -> None:  # fmt: skip
    """Rank `rank` of a data-parallel trainer: Steps on its columns of each rollout; put
    (rank, (state_dict, losses per Step)) on `results`."""
    from conftest import small_config

    from service.trainer.trainer import Trainer

    comm = group.communicator(rank, deadline_s=60)
    trainer = Trainer(small_config(*settings), comm=comm)
    share = rollouts[0].num_envs // comm.world_size
    losses = []
    for rollout in rollouts:
        result = trainer.step(rollout.columns(rank * share, (rank + 1) * share))
        losses.append(result.losses)
    results.put((rank, (trainer.state_dict(), losses)))  # type: ignore[attr-defined]
    comm.close()


def train_until(group: SharedMemoryGroup, rank: int, settings: tuple[str, ...], rollouts: list,
                stop_after: dict, results: object) -> None:  # fmt: skip
    """A rank that leaves (exits) after `stop_after[rank]` Steps, if named there; the others
    report how their next Step ended."""
    from conftest import small_config

    from service.trainer.trainer import Trainer

    comm = group.communicator(rank, deadline_s=2)
    trainer = Trainer(small_config(*settings), comm=comm)
    share = rollouts[0].num_envs // comm.world_size
    for index, rollout in enumerate(rollouts):
        if index == stop_after.get(rank):
            results.put((rank, "left"))  # type: ignore[attr-defined]
            return
        try:
            trainer.step(rollout.columns(rank * share, (rank + 1) * share))
        except CollectiveTimeout as error:
            results.put((rank, f"Step {index}: {error}"))  # type: ignore[attr-defined]
            return
    results.put((rank, "finished"))  # type: ignore[attr-defined]


def checkpoint_midway(group: SharedMemoryGroup, rank: int, settings: tuple[str, ...],
                      rollouts: list, root: str, results: object) -> None:  # fmt: skip
    """Train on `rollouts`, rank 0 saving a checkpoint after the first half (every rank taking
    part in gathering the replay); put (rank, state_dict at the end) on `results`."""
    from conftest import small_config

    from service.checkpoint import save_checkpoint
    from service.trainer.trainer import Trainer

    comm = group.communicator(rank, deadline_s=60)
    trainer = Trainer(small_config(*settings), comm=comm)
    share = rollouts[0].num_envs // comm.world_size
    for index, rollout in enumerate(rollouts):
        if index == len(rollouts) // 2:
            if rank == 0:
                save_checkpoint(trainer, root, "midway")
            else:
                trainer.state_dict()  # this rank's part of the gather
        trainer.step(rollout.columns(rank * share, (rank + 1) * share))
    results.put((rank, trainer.state_dict()))  # type: ignore[attr-defined]
    comm.close()
