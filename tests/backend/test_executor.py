"""The executor contract on the host: the NumPy executor runs everything inline, at once, and
its settings are Python floats (the CUDA executor's side is tests/gpu/test_executor_cuda.py)."""

from __future__ import annotations

import numpy as np
import pytest

from service.backend import select_backend
from service.backend.executor import HostScalars, NumpyExecutor
from service.config import load_config
from service.trainer import model
from service.trainer.hyper import HOT_KEYS, KEYS, Hyperparams


def test_the_numpy_backend_makes_a_fresh_numpy_executor_per_trainer() -> None:
    backend = select_backend("numpy", {})
    first, second = backend.executor(True, False), backend.executor(False, True)
    assert isinstance(first, NumpyExecutor) and first is not second


def test_scope_fork_join_and_synchronize_run_inline() -> None:
    executor, seen = NumpyExecutor(), []
    with executor.scope():
        result, token = executor.fork(lambda: seen.append("forked") or 7, lane=2)
        assert seen == ["forked"] and result == 7  # done before fork returns
        executor.join(token)
    executor.synchronize()
    executor.synchronize_device()
    assert seen == ["forked"]


def test_run_calls_fn_on_the_inputs_every_time_and_captures_nothing() -> None:
    executor, calls = NumpyExecutor(), []
    x = np.arange(3.0)

    def fn(a: np.ndarray, scale: float) -> np.ndarray:
        calls.append((a, scale))
        return a * scale

    for k in range(4):
        np.testing.assert_array_equal(executor.run(("key", 3), fn, x, float(k)), x * k)
    assert [scale for _, scale in calls] == [0.0, 1.0, 2.0, 3.0]
    assert all(a is x for a, _ in calls)  # no copies: the inputs themselves
    assert executor.captures == 0
    with pytest.raises(KeyError):
        executor.replay(("key", 3))


def test_host_scalars_are_floats_that_keep_float32_arithmetic_float32() -> None:
    scalars = HostScalars(np.array([0.5, 2.0, 3.0]))
    assert scalars.one(1) == 2.0 and type(scalars.one(1)) is float
    assert scalars.span(0, 2) == [0.5, 2.0] and scalars.gather((2, 0)) == [3.0, 0.5]
    assert (np.ones(2, np.float32) * scalars.one(0)).dtype == np.float32
    scalars.write(np.array([1.0, 4.0, 9.0]))
    assert scalars.span(1, 3) == [4.0, 9.0]


def test_hyperparams_read_their_settings_through_the_backend_scalars() -> None:
    config = load_config(env={}, overrides=["train.gamma=0.9", "train.lambda_bce=0.25"])
    hp = Hyperparams(config, select_backend("numpy", model.dims(config)).scalars)
    assert hp["train.gamma"] == 0.9 and hp["zero"] == 0.0
    adjacent = ["train.lambda_pi", "train.lambda_v", "train.lambda_bce"]
    scattered = ["train.lambda_pi", "train.lambda_v", "train.lambda_aux", "train.gamma"]
    first = KEYS.index(adjacent[0])
    assert [KEYS.index(k) for k in adjacent] == [first, first + 1, first + 2]  # a span
    assert hp.weights(adjacent) == [config.train.lambda_pi, config.train.lambda_v, 0.25]
    assert hp.weights(scattered)[-2:] == [config.train.lambda_aux, 0.9]
    hp.refresh(load_config(env={}, overrides=["train.gamma=0.5"]))
    assert hp["train.gamma"] == 0.5 and "train.gamma" in HOT_KEYS
