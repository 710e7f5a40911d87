"""Collectives (service/backend/comm.py) between real processes over shared memory, and the
rendezvous (service/backend/rendezvous.py) between real sockets: sums equal to NumPy's in rank
order, the same bytes on every rank; a rank that never comes makes the others fail within the
deadline, naming what they waited for."""

from __future__ import annotations

import threading

import comm_worker
import numpy as np
import pytest
from comm_worker import SPAWN, run_ranks
from conftest import free_port

from service.backend.comm import SharedMemoryGroup, SingleRank
from service.backend.rendezvous import RendezvousError, Topology, share
from service.errors import InvalidInput


def test_all_reduce_and_broadcast_over_three_processes(seed: int) -> None:
    got = run_ranks(comm_worker.reduce_and_broadcast, 3, seed, slot_bytes=1 << 16)
    results = [got[rank] for rank in range(3)]
    inputs = [inputs for inputs, _ in results]  # type: ignore[misc]
    for k in range(2):  # float64 [1000], float32 [7, 13]
        expected = inputs[0][k] + inputs[1][k] + inputs[2][k]  # rank order
        for _, outputs in results:  # type: ignore[misc]
            assert outputs[k].dtype == expected.dtype
            assert outputs[k].tobytes() == expected.tobytes()
    broadcast = [outputs[2] for _, outputs in results]  # type: ignore[misc]
    assert all(b.tobytes() == broadcast[1].tobytes() for b in broadcast)
    assert not np.array_equal(broadcast[0], np.zeros(33))


def test_a_rank_that_never_comes_fails_the_others_within_the_deadline() -> None:
    got = run_ranks(comm_worker.wait_for_a_dead_rank, 3, 2.0, ranks=(0, 1), slot_bytes=64,
                    timeout_s=60)  # rank 2 never starts  # fmt: skip
    for rank in (0, 1):
        assert f"rank {rank} of 3: all_reduce_sum did not complete within 2 s" in got[rank]


def test_bad_arguments_name_the_field() -> None:
    group = SharedMemoryGroup.create(SPAWN, 2, 64)
    try:
        comm = group.communicator(0, deadline_s=1)
        with pytest.raises(InvalidInput, match="at most 64 bytes"):
            comm.all_reduce_sum(np.zeros(9))  # 72 bytes
        with pytest.raises(InvalidInput, match="C-contiguous"):
            comm.all_reduce_sum(np.zeros((4, 4))[:, 0])
        with pytest.raises(InvalidInput, match="root"):
            comm.broadcast(np.zeros(2), root=2)
        with pytest.raises(InvalidInput, match="rank"):
            group.communicator(2)
        comm.close()
    finally:
        group.close()
    single = SingleRank()
    buffer = np.arange(5.0)
    single.all_reduce_sum(buffer)
    single.broadcast(buffer)
    single.barrier()
    assert buffer.tolist() == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------------------ rendezvous

def meet(world: int, ranks: list[int], port: int, payload: bytes, deadline_s: float) -> dict:
    """`share` on threads for `ranks` of `world`: each rank's bytes, or its error."""
    got: dict[int, object] = {}

    def one(rank: int) -> None:
        topology = Topology.of(rank, world, f"127.0.0.1:{port}")
        try:
            got[rank] = share(topology, payload if rank == 0 else None, deadline_s)
        except RendezvousError as error:
            got[rank] = error

    threads = [threading.Thread(target=one, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return got


def test_rank_zero_hands_its_bytes_to_every_rank(rng: np.random.Generator) -> None:
    payload = rng.bytes(128)  # the size of an NCCL unique id
    got = meet(4, [3, 1, 0, 2], free_port(), payload, 30)
    assert got == {rank: payload for rank in range(4)}


def test_a_missing_rank_is_named_by_rank_zero_and_a_missing_rank_zero_by_the_address() -> None:
    port = free_port()
    got = meet(3, [0, 1], port, b"id", 1.5)
    assert "ranks [2] of 3 did not reach" in str(got[0])
    alone = meet(2, [1], free_port(), b"", 1.0)
    assert "no rank 0 at 127.0.0.1:" in str(alone[1])


def test_a_rank_of_another_world_size_is_refused() -> None:
    port = free_port()
    got: dict[str, object] = {}

    def root() -> None:
        try:
            share(Topology.of(0, 2, f"127.0.0.1:{port}"), b"x", 10)
        except RendezvousError as error:
            got["root"] = error

    thread = threading.Thread(target=root)
    thread.start()
    with pytest.raises(RendezvousError, match="got rank 1 of world 3"):
        share(Topology.of(1, 3, f"127.0.0.1:{port}"), None, 10)
    thread.join(30)
    assert "got rank 1 of world 3" in str(got["root"])


@pytest.mark.parametrize(
    ("env", "field"),
    [({"TRIDENT_WORLD_SIZE": "2", "TRIDENT_RENDEZVOUS": "h:1"}, "TRIDENT_RANK"),
     ({"TRIDENT_RANK": "x", "TRIDENT_WORLD_SIZE": "2", "TRIDENT_RENDEZVOUS": "h:1"},
      "TRIDENT_RANK"),
     ({"TRIDENT_RANK": "2", "TRIDENT_WORLD_SIZE": "2", "TRIDENT_RENDEZVOUS": "h:1"}, "rank"),
     ({"TRIDENT_RANK": "0", "TRIDENT_WORLD_SIZE": "2"}, "TRIDENT_RENDEZVOUS"),
     ({"TRIDENT_RANK": "0", "TRIDENT_WORLD_SIZE": "2", "TRIDENT_RENDEZVOUS": "h"}, "rendezvous"),
     ({"TRIDENT_RANK": "0", "TRIDENT_WORLD_SIZE": "0", "TRIDENT_RENDEZVOUS": "h:1"}, "world_size")],
)  # fmt: skip
def test_the_environment_is_checked_naming_the_variable(env: dict, field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        Topology.from_env(env)
    ok = {"TRIDENT_RANK": "1", "TRIDENT_WORLD_SIZE": "4", "TRIDENT_RENDEZVOUS": "[::1]:2900"}
    assert Topology.from_env(ok) == Topology(1, 4, "::1", 2900)
