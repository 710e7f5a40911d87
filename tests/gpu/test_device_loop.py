"""The integrated loop on the H200: markets, Act and Step all on the device.

`test_integrated_trainer_smoke` trains on GPU LobSim through the device loop and checks that
per Step the host waits for the device once — the Step's statistics readback. Two independent
witnesses: (1) a gate kernel holds the trainer's stream while the host enqueues each piece of
a Step (every Act, every market step, the Step up to its readback); a host call that had to
wait for the device (a `.get()`, an `int(x)`, a boolean-mask index, a stream synchronise, a
blocking copy) would stall behind the gate, and the watchdog reports where, with its stack.
The gate closes per piece, not per Step, because the driver's launch queue (about a thousand
launches) would fill before a whole Step is enqueued and stall the host without any sync.
(2) CuPy's own detector, `cupyx.allow_synchronize(False)`, raises on a synchronising CuPy
call anywhere in the Step except the readback.
"""

from __future__ import annotations

import faulthandler
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from conftest import fresh_seed

from service.config import load_config, with_overrides
from service.jobs.device_loop import DeviceLoop, LoopStep
from service.jobs.train import lobsim_model
from service.lobsim.env import LobSim
from service.trainer.trainer import Trainer

T, N = 16, 512
STALL_S = 20.0  # a gated piece still inside after this long waited for the device
GATE_SOURCE = r"""
extern "C" __global__ void gate_wait(const volatile int* open) {
    while (*open == 0) __nanosleep(20000);
}
"""


def smoke_config(seed: int):
    return lobsim_model(
        load_config(
            env={},
            overrides=[
                "train.backend=cuda",
                "train.cuda_graphs=true",
                f"train.seed={seed}",
                "replay.min_size=1024",  # the C51 head trains from the first Step on
                "replay.batch_size=512",
                "ppo.num_minibatches=4",
                "lobsim.horizon=40",
            ],
        )
    )


class Gate:
    """A kernel spinning on pinned host memory: the stream behind it waits until `open`."""

    def __init__(self) -> None:
        import cupy

        self._memory = cupy.cuda.alloc_pinned_memory(4)
        self._flag = np.frombuffer(self._memory, dtype=np.int32, count=1)
        self._flag[0] = 1
        self._kernel = cupy.RawKernel(GATE_SOURCE, "gate_wait")

    def close(self) -> None:
        """Enqueue the gate on the current stream."""
        self._flag[0] = 0
        self._kernel((1,), (1,), (np.uint64(self._memory.ptr),))

    def open(self) -> None:
        self._flag[0] = 1


class GatedPieces:
    """Wraps the device loop's pieces so each is enqueued behind a closed gate; records how
    many readbacks each Step made and which piece, if any, stalled."""

    def __init__(self, trainer: Trainer, env: LobSim) -> None:
        import cupyx

        self.gate, self.trainer = Gate(), trainer
        self.inside: tuple[str, float] | None = None
        self.readbacks = 0
        self.active = False
        real_to_host = trainer.state.backend.to_host

        def to_host(array):  # the Step's readback: everything is enqueued, let it run
            self.readbacks += 1
            self.gate.open()
            with cupyx.allow_synchronize(True):
                return real_to_host(array)

        trainer.state.backend = replace(trainer.state.backend, to_host=to_host)
        trainer.act_on_device = self._gated("Trainer.act_on_device", trainer.act_on_device)
        trainer.step_on_device = self._gated("Trainer.step_on_device", trainer.step_on_device)
        env.step = self._gated("LobSim.step", env.step)  # type: ignore[method-assign]

    def _gated(self, name: str, fn: Callable) -> Callable:
        import cupyx

        def call(*args, **kwargs):
            if not self.active:
                return fn(*args, **kwargs)
            with self.trainer.on_device():
                self.gate.close()
            self.inside = (name, time.monotonic())
            try:
                with cupyx.allow_synchronize(False):
                    return fn(*args, **kwargs)
            finally:
                self.inside = None
                self.gate.open()
                with cupyx.allow_synchronize(True):
                    self.trainer.synchronize()  # the test's own wait, between pieces

        return call


def thread_stacks() -> str:
    """Every thread's stack, as faulthandler writes it: where a stalled Step waits."""
    with tempfile.TemporaryFile("w+") as out:
        faulthandler.dump_traceback(out, all_threads=True)
        out.seek(0)
        return out.read()


@pytest.mark.filterwarnings("ignore:cupyx.allow_synchronize will be removed")
def test_integrated_trainer_smoke() -> None:
    import cupy
    import cupyx

    seed = fresh_seed()
    config = smoke_config(seed)
    trainer = Trainer(config)
    env = LobSim(N, config.lobsim, seed, backend="cuda")
    loop = DeviceLoop(trainer, env, T)
    pieces = GatedPieces(trainer, env)
    steps: list[LoopStep] = []
    for _ in range(3):  # compile, capture (Act and Step graphs), replay
        steps.append(loop.step())
    assert pieces.readbacks == 3  # one per Step: Act never reads the device back

    pieces.active = True
    for _ in range(2):  # gated Steps
        errors: list[BaseException] = []
        readbacks = pieces.readbacks

        def one_step(errors: list[BaseException] = errors) -> None:
            try:
                with cupyx.allow_synchronize(False):
                    steps.append(loop.step())
            except BaseException as error:  # reported by the main thread
                errors.append(error)

        worker = threading.Thread(target=one_step, daemon=True)
        worker.start()
        stall = None
        while worker.is_alive() and stall is None:
            worker.join(0.05)
            inside = pieces.inside
            if inside is not None and time.monotonic() - inside[1] > STALL_S:
                stall = f"{inside[0]} waited for the device:\n{thread_stacks()}"
                pieces.gate.open()
        worker.join(60)
        assert stall is None, stall
        assert not errors, f"a synchronising CuPy call inside the Step: {errors[0]!r}"
        assert pieces.readbacks == readbacks + 1
    pieces.active = False

    while len(steps) < 40:
        steps.append(loop.step())
    cupy.cuda.Device().synchronize()
    heads = ("q", "pi", "v", "bce", "aux")
    losses = np.array([[s.result.losses[h] for h in heads] for s in steps])
    assert np.isfinite(losses).all()
    assert all(not s.result.skipped for s in steps)
    assert trainer.global_step == 40 and sum(s.episodes for s in steps) > 0
    assert pieces.readbacks == 40
    q, aux = losses[:, 0], losses[:, 4]
    print(f"\n[device loop] C51 loss {q[:5].mean():.4f} -> {q[-5:].mean():.4f}, aux "
          f"{aux[:5].mean():.4f} -> {aux[-5:].mean():.4f}, {pieces.readbacks} readbacks "
          f"for {len(steps)} Steps of {T} x {N} market steps")
    assert q[-5:].mean() < q[:5].mean()
    assert aux[-5:].mean() < aux[:5].mean()


def test_device_loop_on_cuda_matches_numpy() -> None:
    """The first rollout and Step of the device loop: GPU markets and trainer against NumPy."""
    seed = fresh_seed()
    config = smoke_config(seed)
    gpu_trainer = Trainer(config)
    gpu_loop = DeviceLoop(gpu_trainer, LobSim(64, config.lobsim, seed, backend="cuda"), T)
    # the GPU trainer's config: the sizes CUDA picked (model.hidden_dim) are the model compared
    cpu_config = with_overrides(gpu_trainer.config, ["train.backend=numpy"])
    cpu_loop = DeviceLoop(Trainer(cpu_config), LobSim(64, config.lobsim, seed), T)
    gpu, cpu = gpu_loop.step(), cpu_loop.step()
    np.testing.assert_array_equal(gpu_loop.actions.get(), cpu_loop.actions)
    np.testing.assert_allclose(gpu_loop.obs.get(), cpu_loop.obs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu_loop.rewards.get(), cpu_loop.rewards, rtol=1e-6, atol=1e-6)
    for head, loss in cpu.result.losses.items():
        assert gpu.result.losses[head] == pytest.approx(loss, rel=1e-3, abs=1e-5), head
    assert gpu.episodes == cpu.episodes
