"""Data-parallel scaling: the update's samples/s and the integrated loop's env steps/s per
world size, one rank process per device (NCCL) or, on the NumPy backend, per CPU core
(shared memory).

    python bench/multigpu.py                                    # cuda where GPUs are seen
    python bench/multigpu.py --backend numpy --worlds 1 2 --batches 4096 --loop-envs 64

For each world size W: W processes, each a Trainer holding train.data_shards / W = 1 shard
(W = 1: the plain trainer). Update: B samples per Step (T = train.rollout_len rows of B / T
environments), each rank Stepping on its B / W; samples/s = B · Steps / wall time of rank 0,
after 2 warm-up Steps (compile, capture). Loop: each rank runs the device loop
(service/jobs/device_loop.py) on its own N / W LobSim markets, so nothing is shipped between
ranks but the all-reduced sums; env steps/s = N · T · Steps / wall. Speed-up = rate / rate at
W = 1. Writes JSON (command, date, machine, results) to --out and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import platform
import shlex
import socket
import sys
import time
from pathlib import Path

import numpy as np

SPAWN = multiprocessing.get_context("spawn")
WARMUP = 2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_main(kind: str, backend: str, world: int, rank: int, size: int, steps: int,
              seed: int, link: object, results: object) -> None:  # fmt: skip
    """One rank: build its communicator and trainer, time `steps` Steps, report its wall."""
    from service.backend.blas import single_blas_thread
    from service.config import load_config
    from service.jobs.device_loop import DeviceLoop
    from service.jobs.train import lobsim_model
    from service.lobsim.env import LobSim
    from service.trainer.trainer import Trainer
    from service.types import Rollout

    comm = None
    if backend == "cuda":
        import cupy

        cupy.cuda.Device(rank).use()
        if world > 1:
            from service.backend.cuda.nccl import NcclRank
            from service.backend.rendezvous import Topology

            comm = NcclRank.connect(Topology.of(rank, world, str(link)))
    elif world > 1:
        comm = link.communicator(rank)  # type: ignore[attr-defined]
    T = load_config(env={}).train.rollout_len
    config = lobsim_model(load_config(env={}, overrides=[
        f"train.backend={backend}", f"train.seed={seed}", f"train.data_shards={world}",
        f"replay.min_size={size * T // world if kind == 'loop' else size // world}",
        f"replay.capacity={world * max(50_000, 4 * size)}",
    ]))  # fmt: skip
    trainer = Trainer(config, comm=comm)
    if kind == "loop":
        step = DeviceLoop(trainer, LobSim(size // world, config.lobsim, seed + rank,
                                          backend=backend), T).step  # fmt: skip
    else:
        rng = np.random.default_rng([seed, rank])
        n, D, A = size // T // world, config.model.obs_dim, config.model.num_actions
        rollout = Rollout(
            obs=rng.standard_normal((T + 1, n, D)).astype(np.float32),
            actions=rng.integers(0, A, (T, n)).astype(np.int32),
            rewards=rng.standard_normal((T, n)).astype(np.float32),
            terminated=rng.random((T, n)) < 0.01,
            truncated=np.zeros((T, n), dtype=bool),
            behavior_log_probs=np.full((T, n), -np.log(A), dtype=np.float32),
            bce_labels=rng.integers(0, 2, (T, n)).astype(np.uint8),
            aux_targets=rng.standard_normal((T, n, config.model.aux_dim)).astype(np.float32),
        )
        step = lambda: trainer.step(rollout)  # noqa: E731
    with single_blas_thread(backend):  # ranks on the cores, not BLAS pools fighting for them
        for _ in range(WARMUP):
            step()
        trainer.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        trainer.synchronize()
    results.put((rank, time.perf_counter() - started))  # type: ignore[attr-defined]


def run(kind: str, backend: str, world: int, size: int, steps: int, seed: int) -> dict:
    from service.backend.comm import SharedMemoryGroup

    group = None
    if backend == "cuda":
        link: object = f"127.0.0.1:{free_port()}"
    else:
        group = SharedMemoryGroup.create(SPAWN, world, 64 << 20) if world > 1 else None
        link = group
    results = SPAWN.Queue()
    ranks = [SPAWN.Process(target=rank_main, args=(kind, backend, world, rank, size, steps,
                                                   seed, link, results))
             for rank in range(world)]  # fmt: skip
    try:
        for process in ranks:
            process.start()
        walls = dict(results.get(timeout=1800) for _ in ranks)
        for process in ranks:
            process.join(60)
    finally:
        for process in ranks:
            if process.pid is not None:
                process.kill()
        if group is not None:
            group.close()
    from service.config import load_config

    wall = walls[0]
    T = load_config(env={}).train.rollout_len if kind == "loop" else 1  # size: envs or samples
    return {"world": world, "steps": steps, "wall_s": wall, "rate": size * T * steps / wall}


def devices(backend: str) -> int:
    if backend == "numpy":
        return os.cpu_count() or 1
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver
        return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("cuda", "numpy"), default="cuda")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batches", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument("--loop-envs", type=int, nargs="+", default=[65536])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/multigpu.json"))
    args = parser.parse_args(argv)
    available = devices(args.backend)
    worlds = [w for w in args.worlds if w <= available]
    record: dict = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "devices": available},
        "backend": args.backend,
        "skipped_worlds": [w for w in args.worlds if w > available],
        "update": [],
        "loop": [],
    }
    print(f"{args.backend}: {available} device(s); world sizes {worlds}")
    for kind, sizes, unit in (("update", args.batches, "samples/s"),
                              ("loop", args.loop_envs, "env steps/s")):  # fmt: skip
        for size in sizes:
            base = None
            for world in worlds:
                result = run(kind, args.backend, world, size, args.steps, args.seed)
                base = base or result["rate"]
                result |= {"size": size, "speedup": result["rate"] / base}
                record[kind].append(result)
                print(f"{kind:>6} {size:>6} W={world}: {result['rate']:>14,.0f} {unit}  "
                      f"×{result['speedup']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
