"""NCCL through CuPy on one GPU: world size 1 runs through a real communicator (rendezvous,
all-reduce, broadcast, barrier) and its collective is captured in a CUDA graph with the work
around it. Two ranks and more need a multi-GPU machine (bench/multigpu.py, not lent yet)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import free_port

from service.backend.rendezvous import Topology
from service.errors import InvalidInput


@pytest.fixture
def rank() -> object:
    from cupy.cuda import nccl

    if not nccl.available:
        pytest.skip("CuPy finds no NCCL runtime here (the nvidia-nccl-cu13 wheel)")
    from service.backend.cuda.nccl import NcclRank

    comm = NcclRank.connect(Topology.of(0, 1, f"127.0.0.1:{free_port()}"), deadline_s=30)
    yield comm
    comm.close()


def test_world_size_one_through_nccl(rank: object, rng: np.random.Generator) -> None:
    import cupy

    for dtype in (np.float32, np.float64):
        host = rng.standard_normal(4099).astype(dtype)
        buffer = cupy.asarray(host)
        rank.all_reduce_sum(buffer)  # type: ignore[attr-defined]
        rank.broadcast(buffer, root=0)  # type: ignore[attr-defined]
        rank.barrier()  # type: ignore[attr-defined]
        assert buffer.get().tobytes() == host.tobytes()
    with pytest.raises(InvalidInput, match="float32 or float64"):
        rank.all_reduce_sum(cupy.zeros(3, dtype=cupy.int32))  # type: ignore[attr-defined]


def test_the_all_reduce_is_captured_in_a_cuda_graph(rank: object, rng: np.random.Generator) -> None:
    import cupy

    host = rng.standard_normal(1024).astype(np.float32)
    buffer = cupy.asarray(host)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        buffer *= 2
        rank.all_reduce_sum(buffer)  # type: ignore[attr-defined]
        buffer += 1
        graph = stream.end_capture()
        graph.launch()
        graph.launch()
        rank.wait("the captured update")  # type: ignore[attr-defined]
    expected = (host * 2 + 1) * 2 + 1
    np.testing.assert_array_equal(buffer.get(), expected)


def test_nccl_settings_are_pinned() -> None:
    pytest.importorskip("cupy")
    from service.backend.cuda.nccl import DETERMINISTIC, pin_nccl_environment

    env: dict[str, str] = {}
    pin_nccl_environment(env)
    assert env == DETERMINISTIC
    with pytest.raises(InvalidInput, match="NCCL_ALGO"):
        pin_nccl_environment({"NCCL_ALGO": "Tree"})
