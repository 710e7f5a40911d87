"""LobSim env steps per second: N markets stepping together, random actions.

    python bench/lobsim.py                                   # N = 256 1024 4096 16384 65536
    python bench/lobsim.py --sizes 4096 --steps 50 --out /tmp/lobsim.json

One env step = one agent action per market plus `lobsim.events_per_step` (13) background
events. Per N: --warmup untimed steps, then --steps timed steps; env steps/s = N · steps /
wall time, and background events/s = that × 13. Backends: `numpy` (service/lobsim/env.py, the
NumPy engine: one vectorised `Books.apply` per event over all markets), `numba` (the same
markets, their events run by service/lobsim/compiled.py, what LobSim runs on the host where
Numba imports; "not available" elsewhere; 4 × --steps timed, its warm-up steps include the
first step's compile or cache load) and `cuda` (kernels/lobsim.cu runs the market events, one
thread per market; the environment around them runs in CuPy on the device; actions come from
the host each step), which reads "not available" where CuPy sees no GPU.

The integrated loop (--loop-sizes; 0 to skip): `trident train`'s Act -> market step -> Step
with the default model and PPO settings, N markets × `train.rollout_len` steps per Step and
the C51 head training from the first Step (replay.min_size = one rollout). NumPy runs the
host loop, cuda the device loop (service/jobs/device_loop.py: markets, Act and Step on the
GPU). Per N: 2 warm-up Steps (compile, capture), then --loop-steps timed Steps; env steps/s =
N · rollout_len · Steps / wall time, and the share of that time per phase of the device loop
(act, market, update; on CUDA device time from events, "host" the rest). --cartpole-sizes runs
the same device loop on N
CartPoles (bench/cartpole.py; model obs_dim 4, 2 actions, no aux head), the env of the
published vectorised-trainer figures. The NumPy loops run with one BLAS thread, as `trident
train` and `trident serve` do on NumPy (service/backend/blas.py); `--numpy-blas machine` leaves
the BLAS library its own thread count (a loop alone on an idle machine then splits each GEMM
over every core, which no served trainer beside its actors can do).

Writes JSON (command, date, machine, versions, results) to --out (default
bench/results/lobsim.json) and prints tables.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from bench.cartpole import NUM_ACTIONS as NUM_CARTPOLE_ACTIONS
from bench.cartpole import OBS_DIM, CartPole
from service.backend.blas import blas_thread_counts, single_blas_thread
from service.config import Config, LobsimConfig, load_config
from service.jobs.device_loop import DeviceLoop
from service.jobs.train import lobsim_model, make_stepper
from service.lobsim import compiled
from service.lobsim.env import NUM_ACTIONS, LobSim
from service.trainer.trainer import Trainer

DEFAULT_SIZES = (256, 1024, 4096, 16384, 65536)


def time_backend(backend: str, N: int, steps: int, warmup: int, seed: int) -> dict:
    """`backend`: numpy (the NumPy engine), numba (the compiled host market) or cuda."""
    if backend == "cuda":
        env = LobSim(N, LobsimConfig(), seed=seed, backend="cuda")
    else:
        env = LobSim(N, LobsimConfig(), seed=seed, engine=backend)
    rng = np.random.default_rng(seed)
    actions = rng.integers(0, NUM_ACTIONS, (warmup + steps, N))
    for t in range(warmup):
        env.step(actions[t])
    started = time.perf_counter()
    for t in range(warmup, warmup + steps):
        env.step(actions[t])
    if backend == "cuda":
        import cupy

        cupy.cuda.Device().synchronize()
    wall = time.perf_counter() - started
    rate = N * steps / wall
    return {
        "available": True,
        "steps": steps,
        "wall_s": wall,
        "env_steps_per_s": rate,
        "events_per_s": rate * env.cfg.events_per_step,
        "overflow": int(env.books.overflow.sum()),  # (a device sync for cuda, after timing)
    }


class Phases:
    """Where a loop Step's time goes (DeviceLoop's PhaseMarks): on NumPy the host's wall time
    from each mark to the next; on CUDA the device's, from CUDA events recorded on the
    trainer's stream at each mark (read after the Step's readback has synchronised), and the
    host's share is the wall time the device spent in none of them (launch overhead)."""

    def __init__(self, backend: str) -> None:
        self.cuda = backend == "cuda"
        self.seconds: dict[str, float] = {}
        self._marks: list[tuple[str, object]] = []

    def mark(self, phase: str) -> None:
        if self.cuda:
            import cupy

            stamp: object = cupy.cuda.get_current_stream().record()
        else:
            stamp = time.perf_counter()
        self._marks.append((phase, stamp))
        if phase == "end":
            self._close()

    def _close(self) -> None:
        import itertools

        for (phase, start), (_, stop) in itertools.pairwise(self._marks):
            if self.cuda:
                import cupy

                took = cupy.cuda.get_elapsed_time(start, stop) / 1e3  # type: ignore[arg-type]
            else:
                took = stop - start  # type: ignore[operator]
            self.seconds[phase] = self.seconds.get(phase, 0.0) + took
        self._marks.clear()

    def shares(self, wall: float) -> dict[str, float]:
        """Each phase's share of `wall`; on CUDA also "host", the rest."""
        shares = {phase: took / wall for phase, took in self.seconds.items()}
        if self.cuda:
            shares["host"] = max(0.0, 1.0 - sum(shares.values()))
        return shares


def loop_config(backend: str, N: int, seed: int, *model: str) -> Config:
    T = load_config(env={}).train.rollout_len
    return load_config(
        env={},
        overrides=[f"train.backend={backend}", f"train.seed={seed}", f"train.num_envs={N}",
                   f"replay.min_size={N * T}", f"replay.capacity={max(100_000, 4 * N * T)}",
                   *model],
    )  # fmt: skip


def time_loop(
    backend: str,
    N: int,
    steps: int,
    seed: int,
    env: str = "lobsim",
    sets: tuple[str, ...] = (),
    blas: str = "one",
) -> dict:
    """The integrated loop's env steps/s on `backend` with N markets (or N CartPoles), the
    settings `sets` (section.key=value) on top of the defaults; `blas` "one" runs it with the
    jobs' single BLAS thread, "machine" with the library's own count."""
    threads = single_blas_thread(backend) if blas == "one" else contextlib.nullcontext()
    with threads:
        return _time_loop(backend, N, steps, seed, env, sets)


def _time_loop(
    backend: str, N: int, steps: int, seed: int, env: str, sets: tuple[str, ...]
) -> dict:
    phases = Phases(backend)
    if env == "cartpole":
        shape = (f"model.obs_dim={OBS_DIM}", f"model.num_actions={NUM_CARTPOLE_ACTIONS}",
                 "model.aux_dim=0")  # fmt: skip
        config = loop_config(backend, N, seed, *shape, *sets)
        trainer, T = Trainer(config), config.train.rollout_len
        step = DeviceLoop(trainer, CartPole(N, seed, backend=backend), T, phases).step
    else:
        config = lobsim_model(loop_config(backend, N, seed, *sets))
        trainer, T = Trainer(config), config.train.rollout_len
        if backend == "cuda":
            market = LobSim(N, config.lobsim, seed, backend="cuda")
            step = DeviceLoop(trainer, market, T, phases).step
        else:
            step = make_stepper(trainer, N, T, config.lobsim, seed)  # the host loop: no phases
    for _ in range(2):
        step()
    phases.seconds.clear()  # the warm-up's compiles and captures are not the loop's time
    started = time.perf_counter()
    results = [step() for _ in range(steps)]
    wall = time.perf_counter() - started  # each Step ends with its readback: nothing pending
    applied = sum("q" in r.result.losses for r in results)
    return {
        "phase_shares": phases.shares(wall),
        "available": True,
        "rollout_len": T,
        "steps": steps,
        "steps_with_c51": applied,
        "wall_s": wall,
        "env_steps_per_s": N * T * steps / wall,
        "ms_per_step": 1e3 * wall / steps,
        "blas_threads": max(blas_thread_counts(), default=None),
    }


def cuda_unavailable() -> str | None:
    """Why the CUDA column cannot run here, or None."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
    except Exception as error:  # no CuPy, no driver
        return f"not available: {type(error).__name__}: {error}"
    return "not available: no CUDA device"


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--steps", type=int, default=0, help="timed steps (0: about 2 s per N)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loop-sizes", type=int, nargs="+", default=[256, 4096, 16384])
    parser.add_argument("--loop-steps", type=int, default=5)
    parser.add_argument("--cartpole-sizes", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument(
        "--numpy-loop-max",
        type=int,
        default=256,
        help="largest N of the NumPy integrated loop (it is slow)",
    )
    parser.add_argument(
        "--numpy-blas",
        choices=("one", "machine"),
        default="one",
        help="BLAS threads of the NumPy loops: one, as the jobs and the server run (default), "
        "or the library's own count",
    )
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a setting of the CUDA loops (e.g. train.precision=bf16); repeatable",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/lobsim.json"))
    args = parser.parse_args(argv)
    record = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "config": {"events_per_step": LobsimConfig().events_per_step, "cuda_sets": args.sets},
        "results": [],
        "loop": [],
        "cartpole_loop": [],
    }
    print(f"{'N':>7} | {'numpy env steps/s':>18} | {'numpy events/s':>15} | "
          f"{'numba env steps/s':>18} | cuda")  # fmt: skip
    cuda_reason = cuda_unavailable()
    for N in args.sizes:
        steps = args.steps or max(3, int(2.0 * 30_000 / N))  # about 2 s at 3e4 steps/s
        numpy_result = time_backend("numpy", N, steps, args.warmup, args.seed)
        if compiled.available():
            numba = time_backend("numba", N, 4 * steps, args.warmup, args.seed)
            numba_cell = f"{numba['env_steps_per_s']:>18,.0f}"
        else:
            numba = {"available": False, "reason": "not available: Numba does not import"}
            numba_cell = f"{'not available':>18}"
        if cuda_reason is None:
            cuda = time_backend("cuda", N, max(steps, 20), args.warmup, args.seed)
            cuda_cell = f"{cuda['env_steps_per_s']:,.0f} env steps/s"
        else:
            cuda, cuda_cell = {"available": False, "reason": cuda_reason}, cuda_reason
        record["results"].append({"N": N, "numpy": numpy_result, "numba": numba, "cuda": cuda})
        print(
            f"{N:>7} | {numpy_result['env_steps_per_s']:>18,.0f} | "
            f"{numpy_result['events_per_s']:>15,.0f} | {numba_cell} | {cuda_cell}"
        )
    for env, sizes, key in (("lobsim", args.loop_sizes, "loop"),
                            ("cartpole", args.cartpole_sizes, "cartpole_loop")):  # fmt: skip
        if any(sizes):
            print(f"\n{'N':>7} | {env + ' loop numpy env steps/s':>31} | loop cuda (device loop)")
        for N in (n for n in sizes if n):
            numpy_loop = (
                time_loop("numpy", N, args.loop_steps, args.seed, env, blas=args.numpy_blas)
                if args.numpy_loop_max >= N
                else {"available": False, "reason": "skipped: N > --numpy-loop-max"}
            )
            cuda_loop = (
                time_loop("cuda", N, args.loop_steps, args.seed, env, tuple(args.sets))
                if cuda_reason is None
                else {"available": False, "reason": cuda_reason}
            )
            record[key].append({"N": N, "numpy": numpy_loop, "cuda": cuda_loop})
            cells = [
                f"{r['env_steps_per_s']:,.0f} ({r['ms_per_step']:.1f} ms/Step)"
                if r["available"] else r["reason"]
                for r in (numpy_loop, cuda_loop)
            ]  # fmt: skip
            print(f"{N:>7} | {cells[0]:>31} | {cells[1]}")
            for name, r in (("numpy", numpy_loop), ("cuda", cuda_loop)):
                if r["available"] and r["phase_shares"]:
                    parts = ", ".join(f"{k} {v:.0%}" for k, v in r["phase_shares"].items())
                    print(f"{'':>7}   {name} time per phase: {parts}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
