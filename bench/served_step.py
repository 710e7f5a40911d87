"""What the server's two hot paths cost in-process at served shapes: a Step on a rollout as an
Interact stream hands it over, and a merged Act batch on the published policy.

No gRPC and no other thread: the Trainer the server builds (LobSim's model shape, the backend
and settings of --set), a Step on a host rollout [T, N] (random observations, LobSim's label
shapes, 1 % of the steps truncated with their final observations) followed by the publish the
engine does after it, and Acts of --act-rows rows on the snapshot. Each is timed by wall clock
over --repeats calls after --warmup (kernel compilation, graph capture, the replay filled), and
profiled with cProfile: its own time per call by function, so the host's share (validation,
copies, uploads, launches) stands apart from the time spent waiting for the device (the
readback). Prints a table and writes JSON.

    python3 bench/served_step.py --set train.backend=cuda             # N = 1024 4096
    python3 bench/served_step.py --num-envs 256 --repeats 3 --out /tmp/s.json   # NumPy smoke
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from service.config import LobsimConfig, load_config
from service.lobsim.env import LABEL_DIM, NUM_ACTIONS, observation_dim
from service.testing import host_report
from service.trainer.trainer import Trainer
from service.types import ActMode, Rollout

OBS_DIM = observation_dim(LobsimConfig())
TRUNCATED_SHARE = 0.01


def lobsim_shaped_rollout(T: int, N: int, rng: np.random.Generator) -> Rollout:
    """A rollout of LobSim's shapes with random values, as an Interact stream assembles it."""
    truncated = rng.random((T, N)) < TRUNCATED_SHARE
    index = np.flatnonzero(truncated.reshape(-1))
    return Rollout(
        obs=rng.standard_normal((T + 1, N, OBS_DIM), dtype=np.float32),
        actions=rng.integers(0, NUM_ACTIONS, (T, N), dtype=np.int32),
        rewards=rng.standard_normal((T, N), dtype=np.float32),
        terminated=np.zeros((T, N), bool),
        truncated=truncated,
        behavior_log_probs=np.log(rng.uniform(0.05, 1.0, (T, N))).astype(np.float32),
        final_obs=rng.standard_normal((index.size, OBS_DIM), dtype=np.float32),
        final_obs_index=index.astype(np.int64),
        policy_version=None,
        bce_labels=rng.integers(0, 2, (T, N), dtype=np.uint8),
        aux_targets=rng.standard_normal((T, N, LABEL_DIM), dtype=np.float32),
    )


def profiled(call: Callable[[], Any], warmup: int, repeats: int, top: int) -> dict[str, Any]:
    """Wall ms per call (median, mean) and cProfile's own time per call by function."""
    for _ in range(warmup):
        call()
    walls = []
    profile = cProfile.Profile()
    for _ in range(repeats):
        started = time.perf_counter()
        profile.enable()
        call()
        profile.disable()
        walls.append(time.perf_counter() - started)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    own = sorted(((tt, f"{Path(name[0]).name}:{name[1]}({name[2]})", calls)
                  for name, (calls, _, tt, _, _) in stats.items()), reverse=True)  # fmt: skip
    per = lambda seconds: round(1e3 * seconds / repeats, 4)  # noqa: E731
    return {
        "wall_ms_median": round(1e3 * float(np.median(walls)), 3),
        "wall_ms_mean": round(1e3 * float(np.mean(walls)), 3),
        "profiled_ms_per_call": per(sum(tt for tt, _, _ in own)),
        "calls_per_call": round(sum(c for _, _, c in own) / repeats, 1),
        "top": [{"function": n, "calls": c, "ms_per_call": per(tt)} for tt, n, c in own[:top]],
    }


def measure_shape(N: int, args: argparse.Namespace, checkpoints: str) -> list[dict[str, Any]]:
    """The Step on a [T, N] rollout, then the Acts of --act-rows, on a fresh trainer."""
    rng = np.random.default_rng(args.seed)
    config = load_config(env={}, overrides=[
        f"model.obs_dim={OBS_DIM}", f"model.num_actions={NUM_ACTIONS}",
        f"model.aux_dim={LABEL_DIM}", f"checkpoint.dir={checkpoints}",
        "train.max_policy_lag=1000000", *args.set])  # fmt: skip
    trainer = Trainer(config)
    snapshot = trainer.snapshot()
    rollout = lobsim_shaped_rollout(args.rollout_len, N, rng)
    backend = trainer.backend.name

    def step() -> None:
        trainer.step(rollout)
        snapshot.publish()

    rows = [{"what": "step", "T": args.rollout_len, "N": N, "backend": backend,
             **profiled(step, args.warmup, args.repeats, args.top)}]  # fmt: skip
    for act_rows in args.act_rows:
        obs = rng.standard_normal((act_rows, OBS_DIM), dtype=np.float32)
        act = lambda obs=obs: snapshot.act(obs, ActMode.SAMPLE, 0.0)  # noqa: E731
        rows.append({"what": "act", "rows": act_rows, "N": N, "backend": backend,
                     **profiled(act, args.warmup, args.act_repeats, args.top)})  # fmt: skip
    return rows


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as checkpoints:
        return [row for N in args.num_envs for row in measure_shape(N, args, checkpoints)]


def print_rows(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        shape = f"[{row['T']}, {row['N']}]" if row["what"] == "step" else f"{row['rows']} rows"
        print(f"\n{row['what']} {shape} ({row['backend']}): wall {row['wall_ms_median']:.2f} ms "
              f"median, {row['wall_ms_mean']:.2f} mean; profiled {row['profiled_ms_per_call']:.2f}"
              f" ms, {row['calls_per_call']:.0f} Python calls a call")  # fmt: skip
        print(f"{'ms / call':>10}  {'calls':>6}  function")
        for top in row["top"]:
            print(f"{top['ms_per_call']:>10.3f}  {top['calls']:>6}  {top['function']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1024, 4096],
                        help="N: the rollout's columns (one actor's environments)")
    parser.add_argument("--rollout-len", type=int, default=32, help="T")
    parser.add_argument("--act-rows", type=int, nargs="*", default=[4096, 12288],
                        help="rows of the Act batches timed after each N's Steps")
    parser.add_argument("--repeats", type=int, default=20, help="timed Steps per N")
    parser.add_argument("--act-repeats", type=int, default=100, help="timed Acts per size")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=15, help="functions listed per row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a trainer setting (repeatable), e.g. train.backend=cuda")
    parser.add_argument("--out", type=Path, default=Path("bench/results/served_step.json"))
    args = parser.parse_args(argv)
    if min(args.num_envs) < 1 or args.repeats < 1 or args.act_repeats < 1:
        parser.error("expected --num-envs, --repeats and --act-repeats >= 1")
    rows = measure(args)
    print_rows(rows)
    host_report.write_record(args.out, "bench/served_step.py",
                             ["numpy", "cupy-cuda13x", "trident"], {"rows": rows})  # fmt: skip
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
