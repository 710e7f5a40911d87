"""Data-parallel Steps on one GPU: a trainer holding both of train.data_shards = 2 (its replay
rings, its minibatch shares; captured in CUDA graphs) matches the NumPy one, and a trainer
whose sums go through NCCL with one rank (the ranks' code path, the all-reduce inside the
captured update) matches a plain CUDA trainer."""

from __future__ import annotations

import pytest
from conftest import free_port, random_steps, small_config

from service.backend.rendezvous import Topology
from service.testing.models import GPU_SIZES, SHARDS
from service.trainer.trainer import Trainer

from .test_trainer_cuda import weight_tolerance, worst_weight_error


def compare(got: Trainer, want: Trainer, seed: int, steps: int, tolerance: float) -> None:
    """`steps` Steps of both at `seed` give the same updates, losses within 1e-3 and weights
    within `tolerance`."""
    got_results, want_results = random_steps(got, seed, steps), random_steps(want, seed, steps)
    assert all("q" in r.losses for r in want_results[-3:])
    for a, b in zip(got_results, want_results, strict=True):
        assert a.updates_applied == b.updates_applied
        for head, loss in b.losses.items():
            assert a.losses[head] == pytest.approx(loss, rel=1e-3, abs=1e-5), head
    worst = worst_weight_error(got, want)
    assert worst < tolerance, worst


def sharded(backend: str) -> Trainer:
    return Trainer(small_config(*GPU_SIZES, *SHARDS, f"train.backend={backend}"))


def test_two_shards_on_cuda_match_numpy(seed: int) -> None:
    cuda, cpu = sharded("cuda"), sharded("numpy")
    compare(cuda, cpu, seed, 10, weight_tolerance(lambda: sharded("numpy"), seed, 10))
    assert len(cuda.state.replay) == len(cpu.state.replay)


def test_one_rank_through_nccl_matches_a_plain_cuda_trainer(seed: int) -> None:
    from cupy.cuda import nccl

    if not nccl.available:
        pytest.skip("CuPy finds no NCCL runtime here (the nvidia-nccl-cu13 wheel)")
    from service.backend.cuda.nccl import NcclRank

    comm = NcclRank.connect(Topology.of(0, 1, f"127.0.0.1:{free_port()}"), deadline_s=60)
    try:
        ranked = Trainer(small_config(*GPU_SIZES, "train.backend=cuda"), comm=comm)
        plain = Trainer(small_config(*GPU_SIZES, "train.backend=cuda"))
        compare(ranked, plain, seed, 10, 1e-5)
        assert ranked.executor.captures > 0  # the all-reduce ran inside captured updates
    finally:
        comm.close()
