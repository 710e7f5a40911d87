"""Data parallel on the NumPy backend: 2 ranks (processes over shared memory), each holding one
of train.data_shards = 2 shards (half the environments, its minibatch share, its replay ring),
end 10 Steps where 1 trainer holding both shards ends on the full rollouts: every tensor within
1e-12 of its norm in float64, 1e-5 of its group's norm in float32; the two ranks hold the same
bytes."""

from __future__ import annotations

import comm_worker
import numpy as np
import pytest
from comm_worker import run_ranks
from conftest import random_rollout, small_config

from service.trainer.trainer import Trainer

STEPS, WORLD = 10, 2


@pytest.mark.parametrize(("dtype", "rtol"), [("float64", 1e-12), ("float32", 1e-5)])
def test_two_ranks_equal_one_trainer_on_the_full_batch(
    dtype: str, rtol: float, rng: np.random.Generator, seed: int
) -> None:
    settings = ("train.data_shards=2", f"model.dtype={dtype}", f"train.seed={seed}",
                "replay.capacity=512")  # fmt: skip
    rollouts = [random_rollout(rng, T=5, N=8) for _ in range(STEPS)]
    single = Trainer(small_config(*settings))
    expected_losses = [single.step(rollout).losses for rollout in rollouts]
    assert "q" in expected_losses[-1]  # the C51 head trained on the sharded replay
    expected = single.state_dict()
    got = run_ranks(comm_worker.train_rank, WORLD, settings, rollouts)
    (first, losses), (second, _) = got[0], got[1]  # type: ignore[misc]
    assert set(first) == set(second)
    for name in first:
        if not name.startswith("replay/"):
            assert first[name].tobytes() == second[name].tobytes(), name
    # Each tensor within rtol of its norm, or (float32) of its group's (params/, target/,
    # optim/...): Adam moves a 1-element bias by ±lr per update, so one can end near 0 where
    # float32's different sum order (two half-batches added) is a larger share of it (seed
    # 1919171235: params/bce/b = -6.4e-4, off by 9.3e-9).
    groups: dict[str, list[np.ndarray]] = {}
    for name, want in expected.items():
        groups.setdefault(name.split("/")[0], []).append(want.astype(np.float64).ravel())
    for name, want in expected.items():
        if name.startswith(("params/", "target/", "optim/", "counters/")):
            error = np.linalg.norm((first[name] - want).astype(np.float64))
            scale = np.linalg.norm(want.astype(np.float64))
            if dtype == "float32":
                scale = max(scale, np.linalg.norm(np.concatenate(groups[name.split("/")[0]])))
            assert error <= rtol * scale + 1e-30, name
    for got, want in zip(losses, expected_losses, strict=True):
        assert got.keys() == want.keys()
        for head in want:
            assert got[head] == pytest.approx(want[head], rel=100 * rtol, abs=100 * rtol), head


def test_rollout_columns_keep_their_final_observations(rng: np.random.Generator) -> None:
    rollout = random_rollout(rng, T=6, N=8)
    assert rollout.final_obs is not None and rollout.final_obs_index is not None
    parts = [rollout.columns(0, 3), rollout.columns(3, 8)]
    for part, start in zip(parts, (0, 3), strict=True):
        width = part.num_envs
        np.testing.assert_array_equal(part.obs, rollout.obs[:, start : start + width])
        for i, index in enumerate(part.final_obs_index):  # type: ignore[arg-type]
            t, n = divmod(int(index), width)
            whole = t * rollout.num_envs + n + start
            (j,) = np.flatnonzero(rollout.final_obs_index == whole)
            np.testing.assert_array_equal(part.final_obs[i], rollout.final_obs[j])  # type: ignore[index]
    assert sum(len(p.final_obs) for p in parts) == len(rollout.final_obs)  # type: ignore[arg-type]


def test_a_sharded_trainer_saves_restores_and_continues_bit_identically(
    tmp_path: object, rng: np.random.Generator, seed: int
) -> None:
    from service.checkpoint import restore_checkpoint, save_checkpoint

    settings = ("train.data_shards=2", f"train.seed={seed}", "replay.capacity=512")
    rollouts = [random_rollout(rng, T=5, N=8) for _ in range(6)]
    never_stopped = Trainer(small_config(*settings))
    for rollout in rollouts[:3]:
        never_stopped.step(rollout)
    info = save_checkpoint(never_stopped, tmp_path)  # type: ignore[arg-type]
    resumed = Trainer(small_config(*settings))
    restore_checkpoint(resumed, tmp_path, info.name)  # type: ignore[arg-type]
    for rollout in rollouts[3:]:
        never_stopped.step(rollout)
        resumed.step(rollout)
    assert resumed.param_digest() == never_stopped.param_digest()
    assert len(resumed.state.replay) == len(never_stopped.state.replay) == 2 * 6 * 20


def test_a_rank_that_dies_fails_the_others_fast(rng: np.random.Generator, seed: int) -> None:
    """Rank 1 leaves after 2 Steps: rank 0's third Step raises within its 2 s deadline."""
    settings = ("train.data_shards=2", f"train.seed={seed}", "replay.capacity=512")
    rollouts = [random_rollout(rng, T=5, N=8) for _ in range(4)]
    got = run_ranks(comm_worker.train_until, WORLD, settings, rollouts, {1: 2}, timeout_s=120)
    assert got[1] == "left"
    assert got[0].startswith("Step 2: rank 0 of 2:") and "within 2 s" in got[0], got[0]


def test_a_checkpoint_of_two_ranks_restores_on_one_and_continues(
    tmp_path: object, rng: np.random.Generator, seed: int
) -> None:
    """Rank 0 saves after 3 of 6 Steps (the replay gathered from both ranks); one trainer
    restores it and takes the last 3 Steps: it ends where the ranks end (float64, 1e-12)."""
    from pathlib import Path

    from service.checkpoint import restore_checkpoint

    root = Path(str(tmp_path))
    settings = ("train.data_shards=2", "model.dtype=float64", f"train.seed={seed}",
                "replay.capacity=512")  # fmt: skip
    rollouts = [random_rollout(rng, T=5, N=8) for _ in range(6)]
    ended = run_ranks(comm_worker.checkpoint_midway, WORLD, settings, rollouts, str(root))
    resumed = Trainer(small_config(*settings))
    restore_checkpoint(resumed, root, "midway")
    assert resumed.global_step == 3 and len(resumed.state.replay) == 3 * 40
    for rollout in rollouts[3:]:
        resumed.step(rollout)
    want = resumed.state_dict()
    for name, array in ended[0].items():  # type: ignore[attr-defined]
        assert array.shape == want[name].shape, name  # the ranks' replay gathered whole
        if not name.startswith("replay/"):
            np.testing.assert_allclose(array, want[name], rtol=1e-12, atol=1e-12, err_msg=name)
    for name in ("obs", "actions", "rewards", "next_obs"):
        np.testing.assert_array_equal(ended[0][f"replay/{name}"], want[f"replay/{name}"])  # type: ignore[index]
