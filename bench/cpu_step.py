"""Time one trainer update on the CPU: the NumPy backend against plain eager PyTorch.

One update = one PPO minibatch of B rollout rows stacked on a replay batch of B rows through
the encoder, the pi / v / bce / aux heads on the rollout rows, the C51 head on the replay rows
with the target network's forward and categorical projection, backward, global-norm clip,
AdamW on every tensor and the target network's refresh.

    python bench/cpu_step.py                      # B = 256 1024 4096, both columns
    python bench/cpu_step.py --sizes 256 --no-torch --repeats 50
    python bench/cpu_step.py --profile 4096       # cProfile + per-op times of the NumPy update

Writes the per-size median / p10 / p90 (ms) with the machine, versions and BLAS setup to
--out (JSON). OPENBLAS_* / OMP_* variables are recorded, never changed.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import functools
import io
import json
import math
import os
import platform
import pstats
import resource
import shlex
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np

from service.config import load_config
from service.trainer.trainer import Trainer
from service.trainer.update import APPLIED, STATS_SIZE
from service.types import Rollout, Transitions

D, H, DEPTH, A, Z, K = 40, 256, 2, 9, 51, 3
ENV_VARS = (
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "GOMP_SPINCOUNT",
    "MALLOC_MMAP_THRESHOLD_",  # glibc malloc knobs: they decide the page-fault cost of
    "MALLOC_TRIM_THRESHOLD_",  # NumPy's large temporaries (see docs/benchmarks/cpu_step.md)
    "MALLOC_TOP_PAD_",
    "GLIBC_TUNABLES",
)


# ------------------------------------------------------------------------------- setup
def make_config(B: int, args: argparse.Namespace):
    overrides = [
        "train.backend=numpy",
        "model.dtype=float32",
        f"model.obs_dim={D}",
        f"model.hidden_dim={H}",
        f"model.depth={DEPTH}",
        f"model.num_actions={A}",
        f"model.aux_dim={K}",
        f"c51.num_atoms={Z}",
        f"c51.target_tau={args.tau}",  # > 0: Polyak refresh every update, as in the torch twin
        f"replay.capacity={max(args.replay_fill, B)}",
        f"replay.batch_size={B}",
        f"replay.min_size={B}",  # <= the filled size, so the Q head and target net run
        "ppo.num_minibatches=1",  # one minibatch = all B rollout rows
        f"train.rollout_len={args.horizon}",
        f"train.num_envs={B // args.horizon}",
        f"train.seed={args.seed}",
    ]
    return load_config(env={}, overrides=overrides)


def random_rollout(cfg, rng: np.random.Generator) -> Rollout:
    T, N = cfg.train.rollout_len, cfg.train.num_envs
    logits = rng.normal(size=(T, N, A))
    log_pi = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    actions = rng.integers(0, A, size=(T, N))
    return Rollout(
        obs=rng.normal(size=(T + 1, N, D)).astype(np.float32),
        actions=actions.astype(np.int32),
        rewards=rng.normal(size=(T, N)).astype(np.float32),
        terminated=rng.random((T, N)) < 0.02,
        truncated=np.zeros((T, N), dtype=bool),
        behavior_log_probs=np.take_along_axis(log_pi, actions[..., None], -1)[..., 0].astype(
            np.float32
        ),
        bce_labels=(rng.random((T, N)) < 0.5).astype(np.uint8),
        aux_targets=rng.normal(size=(T, N, K)).astype(np.float32),
    )


def random_transitions(count: int, rng: np.random.Generator) -> Transitions:
    return Transitions(
        obs=rng.normal(size=(count, D)).astype(np.float32),
        actions=rng.integers(0, A, size=count).astype(np.int32),
        rewards=rng.normal(size=count).astype(np.float32),
        dones=(rng.random(count) < 0.02).astype(np.uint8),
        horizons=np.ones(count, dtype=np.int32),
        next_obs=rng.normal(size=(count, D)).astype(np.float32),
    )


def numpy_setup(B: int, args: argparse.Namespace):
    """A warm trainer (full replay, one random Step applied), its prepared batch and rows."""
    cfg = make_config(B, args)
    rng = np.random.default_rng(args.seed)
    trainer = Trainer(cfg)
    trainer.state.replay.insert(random_transitions(cfg.replay.capacity - B, rng))
    rollout = random_rollout(cfg, rng)
    result = trainer.step(rollout)  # inserts B more transitions, runs 2 full updates
    if result.skipped or "q" not in result.losses:
        raise RuntimeError(f"warm-up Step did not apply a full update: {result}")
    batch = trainer.learner.batch(rollout)
    rows = np.random.default_rng(args.seed + 1).permutation(B)  # what Step's shuffle yields
    return trainer, batch, rows, rollout


def make_update(trainer: Trainer, batch, rows: np.ndarray) -> Callable[[], None]:
    totals = np.zeros(STATS_SIZE)

    def update() -> None:
        # Updates.update is exactly one optimizer update (replay sample, encoder fwd on
        # [B minibatch; B replay], every head's loss and backward, target-net forward +
        # projection, global norm, AdamW on every group, target refresh), i.e. the body of
        # Step's minibatch loop, without the values, GAE and the replay insert. It advances
        # the replay draw's sequence itself, as in a Step.
        applied = totals[APPLIED]
        trainer.learner.updates.update(batch, rows, True, totals, first=False)
        if totals[APPLIED] != applied + 1:
            raise RuntimeError("a benchmarked update was not applied (non-finite values)")

    return update


def numpy_update_fn(B: int, args: argparse.Namespace) -> Callable[[], None]:
    trainer, batch, rows, _ = numpy_setup(B, args)
    return make_update(trainer, batch, rows)


# ------------------------------------------------------------------------------- torch twin
def torch_update_fn(B: int, args: argparse.Namespace) -> Callable[[], None]:
    """The same update written plainly in eager PyTorch (bench/torch_update.py), on the same
    data: the NumPy trainer's rollout batch, replay storage and minibatch rows."""
    import torch
    from torch_update import make_torch_update

    torch.set_num_threads(os.cpu_count() or 1)
    trainer, batch, rows_np, _ = numpy_setup(B, args)  # same config, data and replay
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    size = len(trainer.state.replay)
    data = {
        "rollout": {
            "obs": t(batch.obs),
            "actions": t(batch.actions),
            "old_logp": t(batch.behavior_log_probs),
            "advantages": t(batch.advantages),
            "returns": t(batch.returns),
            "bce_y": t(batch.bce_labels),
            "aux_y": t(batch.aux_targets),
            "rows": t(rows_np),
        },
        "store": {k: t(v[:size]) for k, v in trainer.state.replay.storage.items()},
    }
    tu = make_torch_update(B, trainer.config, "cpu", capturable=False, seed=args.seed, data=data)

    def update() -> None:
        tu.update()
        # the statistics the NumPy path also reports, read as host floats; the norm checked
        stats = tu.out["stats"].tolist()
        if not math.isfinite(stats[3]):
            raise RuntimeError("non-finite gradient")

    return update


# ------------------------------------------------------------------------------- timing
def busy_seconds() -> float | None:
    """CPU seconds all processes have spent busy (user+nice+system+irq+softirq+steal)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    busy = sum(ticks[:3]) + sum(ticks[5:8])  # user nice system | irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def time_block(fn: Callable[[], None], warmup: int, repeats: int, settle_s: float) -> dict:
    """`repeats` timed calls after `warmup` untimed ones, with the CPU share others used."""
    time.sleep(settle_s)  # let the other library's thread pool stop spinning first
    for _ in range(warmup):
        fn()
    samples = []
    busy0, own0, wall0 = busy_seconds(), time.process_time(), time.perf_counter()
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(1e3 * (time.perf_counter() - start))
    busy1, own1, wall1 = busy_seconds(), time.process_time(), time.perf_counter()
    foreign = None
    if busy0 is not None and busy1 is not None:
        # Share of the machine other processes used while this block was timed: a contended
        # run (other jobs on these cores) shows up here, not only as a wide p10-p90.
        other = max(0.0, (busy1 - busy0) - (own1 - own0))
        foreign = other / ((wall1 - wall0) * (os.cpu_count() or 1))
    return {"samples_ms": samples, "foreign_cpu_share": foreign}


def summarize(blocks: list[dict], warmup: int) -> dict:
    s = np.concatenate([b["samples_ms"] for b in blocks])
    shares = [b["foreign_cpu_share"] for b in blocks if b["foreign_cpu_share"] is not None]
    return {
        "median_ms": float(np.median(s)),
        "p10_ms": float(np.percentile(s, 10)),
        "p90_ms": float(np.percentile(s, 90)),
        "min_ms": float(s.min()),
        "repeats": int(s.size),
        "blocks": len(blocks),
        "warmup_per_block": warmup,
        "block_medians_ms": [round(float(np.median(b["samples_ms"])), 3) for b in blocks],
        "foreign_cpu_share_max": round(max(shares), 3) if shares else None,
        "samples_ms": [round(float(x), 3) for x in s],
    }


def repeats_for(B: int, args: argparse.Namespace) -> int:
    return args.repeats if B < 4096 or args.repeats_large is None else args.repeats_large


# ------------------------------------------------------------------------------- metadata
def lscpu_model() -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return None


def blas_info() -> dict:
    try:
        deps = np.show_config(mode="dicts").get("Build Dependencies", {})
        return {
            k: {f: v.get(f) for f in ("name", "version", "openblas configuration")}
            for k, v in deps.items()
        }
    except Exception as error:  # metadata only; never fail the run over it
        return {"error": repr(error)}


def metadata(args: argparse.Namespace) -> dict:
    meta = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "lscpu_model_name": lscpu_model(),
            "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg(),
        },
        "env": {name: os.environ.get(name) for name in ENV_VARS},
        "versions": {"numpy": np.__version__},
        "numpy_blas": blas_info(),
        "shapes": {
            "D": D,
            "H": H,
            "depth": DEPTH,
            "A": A,
            "Z": Z,
            "K": K,
            "dtype": "float32",
            "rollout_rows": "B",
            "replay_rows": "B",
            "replay_filled": args.replay_fill,
            "target_tau": args.tau,
            "rollout_len": args.horizon,
        },
    }
    return meta


# ------------------------------------------------------------------------------- profiling
def profile_numpy(B: int, args: argparse.Namespace) -> str:
    """cProfile of `repeats` NumPy updates plus a per-op wall-clock breakdown (ms/update)."""
    from service.trainer import model

    trainer, batch, rows, _ = numpy_setup(B, args)
    update = make_update(trainer, batch, rows)
    n = repeats_for(B, args)
    for _ in range(args.warmup):
        update()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        update()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    text.write(f"# cProfile, B={B}, {n} updates (times are totals over all updates)\n")
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)

    # Per-op breakdown: wrap every op, the encoder passes and the trainer's sub-steps with
    # timers. "own" excludes the wrapped calls nested inside (the GEMMs of encoder_fwd are its
    # own time, its bias_relu_fwd calls are not); the "own" column sums to the whole update.
    inclusive: dict[str, float] = {}
    own: dict[str, float] = {}
    calls: dict[str, int] = {}
    child_time = [0.0]  # time spent in wrapped callees of the innermost active wrapper

    def timed(name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            outer_children, child_time[0] = child_time[0], 0.0
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent = time.perf_counter() - start
                inclusive[name] = inclusive.get(name, 0.0) + spent
                own[name] = own.get(name, 0.0) + spent - child_time[0]
                calls[name] = calls.get(name, 0) + 1
                child_time[0] = outer_children + spent

        return wrapper

    from service.backend import numpy_ops as ops_module
    from service.backend.opset import OP_NAMES

    ops = types.ModuleType("timed_ops")
    for name in OP_NAMES:
        setattr(ops, name, timed(name, getattr(ops_module, name)))
    updates = trainer.learner.updates
    updates.ops = ops
    saved = {name: getattr(model, name) for name in ("encoder_fwd", "encoder_bwd")}
    for name in saved:
        setattr(model, name, timed(f"model.{name}", saved[name]))
    updates.q_target = timed("Updates.q_target", updates.q_target)
    updates.apply = timed("Updates.apply", updates.apply)
    updates.update = timed("Updates.update", updates.update)
    try:
        for _ in range(args.warmup):
            update()
        for table in (inclusive, own, calls):
            table.clear()
        busy0, own0 = busy_seconds(), time.process_time()
        faults0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        for _ in range(n):
            update()
        wall = time.perf_counter() - start
        busy1, own1 = busy_seconds(), time.process_time()
        faults1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        for name, fn in saved.items():
            setattr(model, name, fn)
    foreign = (
        max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * (os.cpu_count() or 1))
        if busy0 is not None and busy1 is not None
        else float("nan")
    )
    text.write(
        f"\n# Per-op wall time, B={B}, mean over {n} updates: whole update "
        f"{1e3 * wall / n:.2f} ms; {(faults1.ru_minflt - faults0.ru_minflt) / n:.0f} minor "
        f"page faults and {1e3 * (faults1.ru_stime - faults0.ru_stime) / n:.1f} ms system CPU "
        f"per update; other processes used {foreign:.0%} of the CPUs meanwhile\n"
        f"{'own ms':>9} {'incl ms':>9} {'calls':>6}  name (Updates.update's own time: "
        f"indexing, concatenate, the head GEMMs' callers, Python)\n"
    )
    for name, total in sorted(own.items(), key=lambda kv: -kv[1]):
        text.write(
            f"{1e3 * total / n:9.3f} {1e3 * inclusive[name] / n:9.3f} "
            f"{calls[name] / n:6.1f}  {name}\n"
        )
    return text.getvalue()


# ------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=30, help="timed updates per size")
    parser.add_argument(
        "--repeats-large",
        type=int,
        default=None,
        help="timed updates at B >= 4096 (default: --repeats)",
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed updates before each timed block"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds the repeats are split over (numpy and torch alternate)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=0.3,
        help="seconds of sleep before each block (idle thread pools)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/cpu_step.json"))
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch column")
    parser.add_argument("--tau", type=float, default=0.005, help="Polyak factor of the target")
    parser.add_argument(
        "--replay-fill",
        type=int,
        default=100_000,
        help="replay rows stored before timing (the sampled-from buffer)",
    )
    parser.add_argument("--horizon", type=int, default=16, help="rollout T (N = B / T)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--profile",
        type=int,
        nargs="*",
        metavar="B",
        default=None,
        help="profile the NumPy update at these B instead of benchmarking; "
        "writes bench/results/profile_B<B>.txt",
    )
    args = parser.parse_args(argv)
    for B in args.sizes + (args.profile or []):
        if B % args.horizon:
            parser.error(f"B = {B} must be a multiple of --horizon {args.horizon}")

    if args.profile is not None:
        for B in args.profile or args.sizes:
            report = profile_numpy(B, args)
            path = args.out.parent / f"profile_B{B}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(report)
            print(report[report.index("# Per-op") :])
            print(f"wrote {path}")
        return 0

    meta = metadata(args)
    backends: dict[str, Callable] = {"numpy": numpy_update_fn}
    if not args.no_torch:
        import torch

        meta["versions"]["torch"] = torch.__version__
        meta["torch_threads"] = os.cpu_count()
        backends["torch"] = torch_update_fn
    updates = {(name, B): make(B, args) for B in args.sizes for name, make in backends.items()}
    # The repeats are split over --rounds rounds of (B: numpy block, torch block), so slow
    # drift of the machine (shared host, clocks) lands on both columns alike.
    blocks: dict[tuple[str, int], list[dict]] = {key: [] for key in updates}
    for round_ in range(args.rounds):
        for B in args.sizes:
            share = -(-repeats_for(B, args) // args.rounds)
            for name in backends:
                block = time_block(updates[name, B], args.warmup, share, args.settle)
                blocks[name, B].append(block)
                print(
                    f"round {round_ + 1}/{args.rounds} {name:5} B={B:5}: median "
                    f"{np.median(block['samples_ms']):8.2f} ms",
                    file=sys.stderr,
                )
    results = {B: {"B": B} for B in args.sizes}
    for (name, B), runs in blocks.items():
        results[B][name] = summarize(runs, args.warmup)
    for r in results.values():
        if "torch" in r:
            r["ratio_numpy_over_torch"] = r["numpy"]["median_ms"] / r["torch"]["median_ms"]

    print(
        f"{'B':>6} | {'numpy median ms (p10-p90)':>27} | {'torch median ms (p10-p90)':>27}"
        f" | {'numpy/torch':>11}"
    )
    for B, r in results.items():
        n = r["numpy"]
        cell = lambda s: f"{s['median_ms']:8.2f} ({s['p10_ms']:.1f}-{s['p90_ms']:.1f})"  # noqa: E731
        tcell = cell(r["torch"]) if "torch" in r else "-"
        ratio = f"{r['ratio_numpy_over_torch']:.2f}" if "torch" in r else "-"
        print(f"{B:>6} | {cell(n):>27} | {tcell:>27} | {ratio:>11}")

    record = {**meta, "results": list(results.values())}
    record["machine"]["loadavg_at_end"] = os.getloadavg()
    busiest = max(r[k]["foreign_cpu_share_max"] or 0.0 for r in results.values() for k in backends)
    if busiest > 0.05:
        print(
            f"warning: other processes used up to {busiest:.0%} of the CPUs while timing; "
            "the numbers are contended",
            file=sys.stderr,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
