"""BLAS threads and the CPU main job: the same Steps with the BLAS pool as it comes and pinned to
one thread (service/backend/blas.py, what `trident train` does on NumPy).

    python3 bench/blas_threads.py --steps 20 --out bench/results/blas_threads.json
    python3 bench/blas_threads.py --steps 20 --load 1 --out bench/results/blas_threads_loaded.json

Each variant runs in its own process (a fresh BLAS pool): the main job's loop (256 markets x 32
env steps per Step, the default trainer) for `--steps` Steps, timed after one warm-up Step. The
table gives seconds, env steps per second and the BLAS pool's threads; both variants compute the
same numbers (their parameter digests are printed, and must match). `--load K` keeps K
busy-looping processes running meanwhile: another job sharing the machine's cores.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

from service.testing import host_report

VARIANTS = ("default", "pinned")


def child(variant: str, steps: int) -> dict:
    """One variant in this process: seconds for `steps` Steps after a warm-up Step."""
    from service.backend.blas import blas_thread_counts, single_blas_thread
    from service.config import load_config
    from service.config_sizes import sized_for
    from service.jobs.train import lobsim_model, make_stepper
    from service.trainer.trainer import Trainer

    config = sized_for(lobsim_model(load_config(env={}, overrides=["train.backend=numpy"])),
                       "numpy")  # fmt: skip
    trainer = Trainer(config)
    train = config.train
    step = make_stepper(trainer, train.num_envs, train.rollout_len, config.lobsim, train.seed)
    pool = single_blas_thread("numpy") if variant == "pinned" else contextlib.nullcontext()
    with pool:
        threads = blas_thread_counts()
        step()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        seconds = time.perf_counter() - started
    env_steps = steps * train.num_envs * train.rollout_len
    return {
        "variant": variant,
        "blas_threads": threads,
        "seconds": round(seconds, 2),
        "env_steps_per_s": round(env_steps / seconds),
        "digest": trainer.param_digest(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed Steps per variant")
    parser.add_argument("--out", type=Path, help="JSON result file")
    parser.add_argument("--load", type=int, default=0, help="busy processes running alongside")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return 0
    started = dt.datetime.now(dt.UTC)
    rows = []
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        for variant in VARIANTS:
            command = [sys.executable, __file__, "--child", variant, "--steps", str(args.steps)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.splitlines()[-1]))
    finally:
        for process in busy:
            process.kill()
            process.wait()
    print(f"{'BLAS pool':<10} {'threads':>8} {'seconds':>8} {'env steps/s':>12}  digest")
    for row in rows:
        print(f"{row['variant']:<10} {row['blas_threads']!s:>8} {row['seconds']:8.1f} "
              f"{row['env_steps_per_s']:12,}  {row['digest'][:16]}")  # fmt: skip
    same = rows[0]["digest"] == rows[1]["digest"]
    print(f"speed-up {rows[0]['seconds'] / rows[1]['seconds']:.2f}x; same parameters: {same}")
    if args.out:
        record = {
            "command": " ".join(["python3", "bench/blas_threads.py", *(argv or sys.argv[1:])]),
            "started_utc": started.isoformat(timespec="seconds"),
            "machine": host_report.machine(),
            "versions": host_report.versions(["numpy", "threadpoolctl"]),
            "steps": args.steps,
            "busy_processes": args.load,
            "rows": rows,
            "same_parameters": same,
        }
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
