"""The CUDA executor keeps the executor contract: forks run after the work before them, joins
order the work after them, a captured call replays by key with its staged inputs (captured
once), and settings views follow writes into a capture (the host side:
tests/backend/test_executor.py)."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="no CUDA device visible to CuPy (cupy is not installed)")

from service.backend.cuda.executor import CudaExecutor, DeviceScalars  # noqa: E402

N = 1 << 22  # long enough that a missing wait shows as a wrong sum
CHAIN = 40  # kernels queued on one lane before another reads their result


def test_the_first_work_follows_arrays_written_on_the_null_stream() -> None:
    x = cupy.arange(N, dtype=np.int64)  # the null stream, before the executor exists
    executor = CudaExecutor(graphs=False)
    with executor.scope():
        doubled = x * 2
    executor.synchronize()
    assert int(doubled[-1]) == 2 * (N - 1)


def test_a_fork_runs_on_a_side_lane_after_the_work_queued_before_it() -> None:
    executor = CudaExecutor(graphs=False)
    lanes = []
    with executor.scope():
        main = cupy.cuda.get_current_stream().ptr
        x = cupy.zeros(N, dtype=np.float32)
        for _ in range(CHAIN):
            x += 1

        def total() -> cupy.ndarray:
            lanes.append(cupy.cuda.get_current_stream().ptr)
            return x.sum(dtype=np.float64)

        result, token = executor.fork(total, lane=1)
        assert cupy.cuda.get_current_stream().ptr == main  # back on the main lane
        executor.join(token)
        twice = result * 2
    executor.synchronize()
    assert lanes[0] != main
    assert float(twice) == 2.0 * CHAIN * N


@pytest.mark.parametrize("lane", [0, 1, 2])
def test_a_join_orders_the_main_lane_after_the_side_lanes_work(lane: int) -> None:
    executor = CudaExecutor(graphs=False)
    with executor.scope():
        x = cupy.zeros(N, dtype=np.float32)

        def fill() -> None:
            for _ in range(CHAIN):
                cupy.add(x, 1, out=x)

        _, token = executor.fork(fill, lane=lane)
        executor.join(token)
        seen = x.copy()  # the main lane, after the join
    executor.synchronize()
    assert bool((seen == CHAIN).all())


def test_run_is_eager_then_captured_then_replayed_with_staged_inputs() -> None:
    executor, calls, outputs = CudaExecutor(graphs=True), [], []

    def scaled(x: cupy.ndarray, scale: cupy.ndarray) -> cupy.ndarray:
        calls.append(scale.dtype)
        return x * scale

    with executor.scope():
        for k in range(5):
            x = cupy.full(7, k + 1, dtype=np.float32)
            out = executor.run(("scaled", 7), scaled, x, 0.5 * k)
            outputs.append((out, out.get()))  # get() waits for the current lane
        replayed = executor.replay(("scaled", 7))
        executor.synchronize()
    assert len(calls) == 2 and set(calls) == {np.dtype(np.float64)}  # eager, then captured
    assert executor.captures == 1
    for k, (_, values) in enumerate(outputs):
        np.testing.assert_array_equal(values, np.full(7, (k + 1) * 0.5 * k))
    captured = outputs[1][0]
    assert all(out is captured for out, _ in outputs[2:]) and replayed is captured
    np.testing.assert_array_equal(replayed.get(), np.full(7, 5 * 2.0))  # the last inputs
    with pytest.raises(KeyError):
        executor.replay(("scaled", 8))


def test_run_without_graphs_calls_fn_on_the_inputs_themselves() -> None:
    executor, seen = CudaExecutor(graphs=False), []
    with executor.scope():
        x = cupy.ones(3, dtype=np.float32)
        for _ in range(3):
            executor.run("key", lambda a, s: seen.append((a, s)), x, 0.25)
    assert all(a is x and s == 0.25 for a, s in seen) and len(seen) == 3
    assert executor.captures == 0


def test_settings_views_follow_writes_into_a_replayed_capture() -> None:
    executor = CudaExecutor(graphs=True)
    with executor.scope():
        scalars = DeviceScalars(np.array([2.0, 3.0, 5.0]))
        x = cupy.ones(4)

        def weighted() -> cupy.ndarray:
            return x * scalars.one(0) + scalars.gather((2, 1)).sum() + scalars.span(0, 2).sum()

        for _ in range(2):  # eager, captured
            first = executor.run("weighted", weighted)
        scalars.write(np.array([7.0, 11.0, 13.0]))
        again = executor.run("weighted", weighted)
        executor.synchronize()
    assert again is first and executor.captures == 1
    np.testing.assert_array_equal(again.get(), np.full(4, 7.0 + 13.0 + 11.0 + 7.0 + 11.0))
