"""The published policy on the GPU: a snapshot Act on its own stream and graphs answers what the
live trainer's Act answers after the same Steps, also while Steps run beside it."""

from __future__ import annotations

import threading

import numpy as np
from conftest import random_rollout

from service.types import ActMode
from tests.gpu.test_trainer_cuda import trainer

STEPS = 5


def test_a_published_snapshot_acts_as_the_live_trainer(rng: np.random.Generator) -> None:
    served, live = trainer("cuda"), trainer("cuda")  # same seed: same parameters, same draws
    snapshot = served.snapshot()
    obs = rng.standard_normal((64, 6)).astype(np.float32)  # a padded size: nothing added
    for _ in range(STEPS):
        rollout = random_rollout(rng)
        served.step(rollout)
        live.step(rollout)
        snapshot.publish()
        for mode in ActMode:
            got, want = snapshot.act(obs, mode, 0.3), live.act(obs, mode, 0.3)
            assert got.policy_version == want.policy_version == served.global_step
            np.testing.assert_array_equal(got.actions, want.actions)
            assert got.log_probs.tobytes() == want.log_probs.tobytes()
            assert got.values.tobytes() == want.values.tobytes()
    padded = snapshot.act(obs[:37], ActMode.GREEDY_PI)  # 37 rows run as 64
    np.testing.assert_allclose(padded.values, live.act(obs[:37], ActMode.GREEDY_PI).values,
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def test_acts_beside_steps_read_whole_published_versions(rng: np.random.Generator) -> None:
    served = trainer("cuda")
    snapshot = served.snapshot()
    lock, stop = threading.Lock(), threading.Event()
    obs = rng.standard_normal((256, 6)).astype(np.float32)
    seen: list[tuple[int, bytes]] = []
    errors: list[BaseException] = []

    def acting() -> None:
        try:
            while not stop.is_set():
                with lock:
                    got = snapshot.act(obs, ActMode.GREEDY_PI)
                seen.append((got.policy_version, got.values.tobytes()))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    values_at: dict[int, bytes] = {}
    thread = threading.Thread(target=acting)
    thread.start()
    try:
        for _ in range(STEPS):
            served.step(random_rollout(rng))
            with lock:
                snapshot.publish()
                published = snapshot.act(obs, ActMode.GREEDY_PI)
            values_at[served.global_step] = published.values.tobytes()
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    for version, values in seen:  # every Act read one whole published version
        if version in values_at:
            assert values == values_at[version], version


def test_a_warmed_snapshot_captures_nothing_more_and_draws_as_a_cold_one(
    rng: np.random.Generator,
) -> None:
    """warm_up captures every padded Act size up to its bound; the Acts after it capture nothing
    and draw exactly what a snapshot that never warmed up draws (the act counter put back)."""
    warmed, cold = trainer("cuda"), trainer("cuda")
    warm_snapshot, cold_snapshot = warmed.snapshot(), cold.snapshot()
    sizes = warm_snapshot.executor.padded_sizes(3000)
    assert sizes == [64, 256, 1024, 2048, 4096]
    warm_snapshot.warm_up(3000)
    assert warm_snapshot.executor.captures == len(sizes)
    assert warmed.state.counters["act_calls"][0] == 0
    for rows in rng.integers(1, 3000, 6).tolist():
        obs = rng.standard_normal((rows, 6)).astype(np.float32)
        got = warm_snapshot.act(obs, ActMode.SAMPLE)
        want = cold_snapshot.act(obs, ActMode.SAMPLE)
        np.testing.assert_array_equal(got.actions, want.actions)
        assert got.log_probs.tobytes() == want.log_probs.tobytes()
    assert warm_snapshot.executor.captures == len(sizes)


def test_the_snapshot_acts_on_the_devices_most_urgent_streams() -> None:
    """Act's kernels are scheduled ahead of a Step's running beside them: its executor's
    streams have the device's highest priority, the trainer's the default."""
    served = trainer("cuda")
    snapshot = served.snapshot()
    assert served.executor.stream.priority == 0
    assert snapshot.executor.stream.priority < 0  # lower is more urgent; Hopper has a range
