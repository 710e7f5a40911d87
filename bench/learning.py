"""Learning benchmarks: does the trainer learn, how fast, over several seeds, baselines beside it.

    python3 bench/learning.py cartpole --seeds 0 1 2 --out bench/results/learning_cartpole.json
    python3 bench/learning.py lobsim --seeds 0 1 2 --out bench/results/learning_lobsim.json
    python3 bench/learning.py sweep --point "" --point "optim.lr=1e-3" \\
        --point "ppo.epochs=2 ppo.num_minibatches=4" --seeds 0 1 2 --workers 2 --out sweep.json
    python3 bench/learning.py gym --seeds 0 1 2 --workers 2 --out bench/results/learning_gym.json

`cartpole`: a real `trident serve` process shaped for CartPole-v1 and an actor in this process
talking to it over gRPC, until the mean return of the last 100 finished episodes reaches 475 or
the env-step budget runs out; per seed the env steps and wall time to 475. `--via actor` (the
default) runs `trident actor`'s own StreamActor (an Interact stream, `--env-groups` groups);
`--via act-step` an Act per env step and one Step per rollout. `lobsim`: the README's main job
(`trident train`, a subprocess per seed in its own run folder) and its evaluation on held-out
markets: per seed the wall time and the evaluation's table (every baseline, paired differences
with 95 % intervals). `sweep`: the main job at several points × seeds, ranked by the trained
policy's paired difference with the best baseline; each `--point` is one set of settings on top
of the defaults ("" is the defaults themselves), so a sweep varies one choice at a time around
them. `gym`: `trident train --env gymnasium:ID` for CartPole-v1, Acrobot-v1 and LunarLander-v3
(`--envs`) within each env's budget of env steps (GYM_TARGETS), per `--point` and seed, or with
`--via served` through `trident serve --env` and one `trident actor` with no sizes; the job's
evaluation (greedy-π, sampled-π, greedy-Q, random on 100 fresh episodes) against each env's
threshold and the published PPO figure. `--set section.key=value` applies to every run;
`train.backend=cuda` runs on the GPU. Each command prints a table and writes a JSON with the
machine, versions and commit.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import datetime as dt
import functools
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from service.actor import GROUP_SEED_STRIDE, StreamActor, group_sizes
from service.backend import resolve_name
from service.client.client import TridentClient
from service.client.resilient import ResilientLink
from service.config import load_config
from service.config_sizes import job_sized
from service.envs import HOST_NUM_ENVS, GymnasiumVectorEnv, LobSimVectorEnv, make_gymnasium_env
from service.lobsim.env import LABEL_DIM, NUM_ACTIONS, observation_dim
from service.testing import host_report
from service.testing.serverproc import ServerProcess
from service.types import ActMode
from service.vector_env import collect_rollout

CARTPOLE = ("model.obs_dim=4", "model.num_actions=2", "model.aux_dim=0")
SOLVED = 475.0  # CartPole-v1's reward threshold
WINDOW = 100  # finished episodes averaged for the solved test
EVAL_JSON = "eval.json"  # what the main job writes into its run folder (--run-dir)


# ------------------------------------------------------------------------------ CartPole
def cartpole_run(seed: int, sets: list[str], args: argparse.Namespace, workdir: Path) -> dict:
    """One seed: env steps and seconds until the last WINDOW episodes average SOLVED."""
    server_sets = [*CARTPOLE, f"train.seed={seed}", "train.backend=numpy", *sets]
    checkpoints = Path(tempfile.mkdtemp(prefix="ckpt-", dir=workdir))
    with ServerProcess.start(
        workdir, server_sets, checkpoint_dir=checkpoints, startup_timeout_s=120.0
    ) as server:
        client = TridentClient(server.target, timeout_s=600.0)
        groups = args.env_groups if args.via == "actor" else 1
        envs: list[GymnasiumVectorEnv] = [
            make_gymnasium_env("CartPole-v1", size, seed + group * GROUP_SEED_STRIDE)
            for group, size in enumerate(group_sizes(args.num_envs, groups))
        ]
        try:
            recent: deque[float] = deque(maxlen=WINDOW)
            curve, started = [], time.perf_counter()
            solved_at = None
            for env_steps in PATHS[args.via](client, envs, args.rollout_len):
                for env in envs:
                    recent.extend(env.take_returns())
                mean = float(np.mean(recent)) if recent else 0.0
                curve.append((env_steps, round(time.perf_counter() - started, 3), mean))
                if len(recent) == WINDOW and mean >= SOLVED:
                    solved_at = curve[-1]
                if env_steps >= args.budget or solved_at is not None:
                    break
        finally:
            for env in envs:
                env.envs.close()
            client.close()
    return {
        "seed": seed,
        "solved": solved_at is not None,
        "env_steps": solved_at[0] if solved_at else None,
        "seconds": solved_at[1] if solved_at else None,
        "final_mean_return": curve[-1][2] if curve else None,
        "curve": curve[:: max(1, len(curve) // 200)],
    }


def act_step_path(
    client: TridentClient, envs: list[GymnasiumVectorEnv], rollout_len: int
) -> Iterator[int]:
    """Act per env step, a Step per rollout; yields the env steps taken after each Step."""
    (env,) = envs
    env_steps = 0
    while True:
        rollout = collect_rollout(lambda obs: client.act(obs, ActMode.SAMPLE), env, rollout_len)
        client.step(rollout)
        env_steps += rollout.horizon * rollout.num_envs
        yield env_steps


def actor_path(
    client: TridentClient, envs: list[GymnasiumVectorEnv], rollout_len: int
) -> Iterator[int]:
    """`trident actor`'s StreamActor; yields the env steps taken after each env step."""
    link = ResilientLink(client)
    actor = StreamActor(link, list(envs), rollout_len, envs[0].dims.obs_dim, lambda *_: None)
    try:
        while True:
            actor.turn()
            yield actor.progress.env_steps
    finally:
        actor.close()


PATHS: dict[str, Callable[..., Iterator[int]]] = {"actor": actor_path, "act-step": act_step_path}


def cartpole(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="learning-") as tmp:
        for seed in args.seeds:
            run = cartpole_run(seed, args.sets, args, Path(tmp))
            runs.append(run)
            print(f"seed {seed}: " + (
                f"mean return {SOLVED:g} after {run['env_steps']:,} env steps, "
                f"{run['seconds']:.0f} s" if run["solved"]
                else f"not solved in {args.budget:,} env steps "
                     f"(last mean {run['final_mean_return']:.1f})"), flush=True)  # fmt: skip
    solved = [r for r in runs if r["solved"]]
    print(f"\nCartPole-v1 through gRPC: {len(solved)}/{len(runs)} seeds reached a mean of "
          f"{SOLVED:g} over {WINDOW} episodes")  # fmt: skip
    if solved:
        steps = [r["env_steps"] for r in solved]
        seconds = [r["seconds"] for r in solved]
        print(f"env steps: median {np.median(steps):,.0f} (min {min(steps):,}, max {max(steps):,});"
              f" wall time: median {np.median(seconds):.0f} s")  # fmt: skip
    return {"runs": runs, "num_envs": args.num_envs, "rollout_len": args.rollout_len,
            "via": args.via, "env_groups": args.env_groups if args.via == "actor" else 1,
            "budget_env_steps": args.budget}  # fmt: skip


# ------------------------------------------------------------------------------ LobSim
def lobsim_run(
    seed: int, sets: list[str], workdir: Path, timeout_s: float, env: str = "lobsim"
) -> dict[str, Any]:
    """`trident train --env env` for one seed in its own run folder (the main job by default);
    its evaluation JSON, its train.csv rows and wall time."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"seed{seed}-", dir=workdir))
    command = [sys.executable, "-m", "service.cli", "train", "--env", env, "--no-checkpoint",
               "--run-dir", str(run_dir), "--set", f"train.seed={seed}"]  # fmt: skip
    for setting in sets:
        command += ["--set", setting]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=run_dir, env=environ, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited {done.returncode}:\n{done.stderr}")
    report = json.loads((run_dir / EVAL_JSON).read_text())
    with (run_dir / "train.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    lines = done.stdout.splitlines()
    return {"seed": seed, "settings": sets, "env": env, "seconds": round(seconds, 1),
            "job": lines[0] if lines else "",  # "trident train: backend=... steps=..."
            "stdout_tail": lines[-30:], "evaluation": report,
            "curve": [[int(row["env_steps"]), float(row["episode_return"])]
                      for row in rows if row["episode_return"]]}  # fmt: skip


def served_lobsim_run(
    seed: int,
    sets: list[str],
    workdir: Path,
    timeout_s: float,
    groups: int,
    synchronous: bool,
    actors: int | None,
) -> dict[str, Any]:
    """The main job's training through the served path: a real `trident serve` with the job's
    settings (its backend: `train.backend`, NumPy unless set) and, for the job's Steps (the
    server anneals the learning rate over them, as the job does), either `trident actor`'s
    StreamActor here (Interact, `groups` env groups, the job's markets) or, with `actors`, that
    many `trident actor --env lobsim` processes sharing the job's markets, the server's own run
    (one of each actor's rollouts a Step: 8 × 1,024 markets make the CUDA job's [32, 8192]);
    then `trident eval` on the final checkpoint: the same held-out markets and baselines as
    the job's own evaluation."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"served{seed}-", dir=workdir))
    base = load_config(env={}, overrides=[f"train.seed={seed}", "train.backend=numpy", *sets])
    job = job_sized(base, resolve_name(base.train.backend))
    D = observation_dim(job.lobsim)
    server_sets = [f"model.obs_dim={D}", f"model.num_actions={NUM_ACTIONS}",
                   f"model.aux_dim={LABEL_DIM}", f"train.seed={seed}", "train.backend=numpy",
                   f"train.steps={job.train.steps}", *sets]  # fmt: skip
    checkpoints = run_dir / "checkpoints"
    steps, T = job.train.steps, job.train.rollout_len
    started = time.perf_counter()
    with ServerProcess.start(
        run_dir, server_sets, checkpoint_dir=checkpoints, startup_timeout_s=300.0
    ) as server, TridentClient(server.target, timeout_s=600.0) as client:
        if actors is None:
            sizes = group_sizes(job.train.num_envs, groups)
            envs = [LobSimVectorEnv(size, job.lobsim, seed + group * GROUP_SEED_STRIDE)
                    for group, size in enumerate(sizes)]  # fmt: skip
            actor = StreamActor(ResilientLink(client), envs, T, D, lambda *_: None, synchronous)
            while actor.progress.rollouts < steps:
                actor.turn()
                if time.perf_counter() - started > timeout_s:
                    raise RuntimeError(f"seed {seed}: not trained within {timeout_s:g} s")
            actor.close()
        else:
            run_actors(server.target, job.train.num_envs // actors, actors, seed, sets,
                       run_dir, timeout_s)  # fmt: skip
        trained_s = time.perf_counter() - started
        final = client.checkpoint("served")
        trained_steps = final.global_step
    command = [sys.executable, "-m", "service.cli", "eval", "served", "--checkpoint-dir",
               str(checkpoints), "--out-dir", str(run_dir / "eval")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}
    done = subprocess.run(command, cwd=run_dir, env=env, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited {done.returncode}:\n{done.stderr}")
    report = json.loads((run_dir / "eval" / EVAL_JSON).read_text())
    lines = done.stdout.splitlines()
    return {"seed": seed, "settings": sets, "seconds": round(time.perf_counter() - started, 1),
            "training_s": round(trained_s, 1), "steps": trained_steps,
            "env_groups": groups, "synchronous": synchronous, "actors": actors or 1,
            "job": f"served: {steps} Steps of {T}x{job.train.num_envs}",
            "stdout_tail": lines[-30:], "evaluation": report}  # fmt: skip


ACTOR_SEED_STRIDE = 2**24  # actor i's markets are seeded from seed + i * this (groups: 2**20)


def run_actors(target: str, num_envs: int, actors: int, seed: int, sets: list[str],
               run_dir: Path, timeout_s: float) -> None:  # fmt: skip
    """`actors` `trident actor --env lobsim` processes of `num_envs` markets each (the job's
    `lobsim.*` settings), each sending the server's run until its global step reaches
    train.steps; RuntimeError naming the first that failed or outlived `timeout_s`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}
    lobsim_sets = [f"--set={s}" for s in sets if s.startswith("lobsim.")]
    processes = []
    for index in range(actors):
        command = [sys.executable, "-m", "service.cli", "actor", "--server", target, "--env",
                   "lobsim", "--num-envs", str(num_envs), "--seed",
                   str(seed + index * ACTOR_SEED_STRIDE), "--log-every", "1000", *lobsim_sets]
        log = (run_dir / f"actor{index}.log").open("w")
        processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          text=True))  # fmt: skip
    try:
        for index, process in enumerate(processes):
            if process.wait(timeout=timeout_s) != 0:
                tail = (run_dir / f"actor{index}.log").read_text()[-2000:]
                raise RuntimeError(f"actor {index} exited {process.returncode}:\n{tail}")
    finally:
        for process in processes:
            process.kill()


def margin(report: dict[str, Any]) -> float:
    """The trained policy's mean return minus the best baseline's, per market (paired)."""
    return report["paired"][report["best_baseline"]]["return"]["mean"]


def run_all(
    jobs: list[tuple[Any, ...]],
    args: argparse.Namespace,
    summarize: Callable[[list[dict]], dict[str, Any]],
) -> dict[str, Any]:
    """Every (seed, settings[, Gymnasium id]) job, `args.workers` at a time (one BLAS thread
    each); after each one ends, the summary of those ended so far is written to `args.out` (a
    sweep cut short keeps what it measured). A run that fails is recorded with its error."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    runs: list[dict] = []
    with (
        tempfile.TemporaryDirectory(prefix="learning-") as tmp,
        concurrent.futures.ThreadPoolExecutor(args.workers) as pool,
    ):
        run = lobsim_run
        if args.command == "gym" and args.via == "served":
            run = served_gym_run
        elif getattr(args, "via", "in-process") == "served":
            run = functools.partial(served_lobsim_run, groups=args.env_groups,
                                    synchronous=args.synchronous, actors=args.actors)  # fmt: skip
        futures = {
            pool.submit(run, seed, sets, Path(tmp), args.timeout, *env): (seed, sets, *env)
            for seed, sets, *env in jobs  # env: a Gymnasium id, or none (LobSim)
        }
        for future in concurrent.futures.as_completed(futures):
            seed, sets, *env = futures[future]
            try:
                runs.append(future.result())
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as error:
                runs.append({"seed": seed, "settings": sets, "env": env[0] if env else "lobsim",
                             "error": str(error)[-2000:]})  # fmt: skip
                print(f"seed {seed} {' '.join(sets)}: failed: {str(error)[-300:]}", flush=True)
            write(args, summarize(runs))
    return summarize(runs)


def lobsim(args: argparse.Namespace) -> dict[str, Any]:
    def summarize(runs: list[dict]) -> dict[str, Any]:
        return {"runs": sorted(runs, key=lambda run: run["seed"])}

    result = run_all([(seed, args.sets) for seed in args.seeds], args, summarize)
    for run in result["runs"]:
        if "error" not in run:
            print(f"\nseed {run['seed']} ({run['seconds']:.0f} s):")
            print("\n".join(run["stdout_tail"]))
    return result


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    points = [point.split() for point in args.points]
    jobs = [(seed, [*args.sets, *point]) for point in points for seed in args.seeds]
    result = run_all(jobs, args, lambda runs: ranking(points, runs, args))
    print(f"\n{'Δ vs best baseline':>18} {'return':>8} {'seconds':>8}  settings (per-seed Δ)")
    for row in result["ranking"]:
        per_seed = ", ".join(f"{m:+.2f}" for m in row["margins"])
        print(f"{row['margin_mean']:+18.2f} {np.mean(row['returns']):8.2f} "
              f"{np.mean(row['seconds']):8.0f}  {' '.join(row['settings']) or '(defaults)'}"
              f"  [{per_seed}]")  # fmt: skip
    return result


def ranking(points: list[list[str]], runs: list[dict], args: argparse.Namespace) -> dict:
    """Each point's paired margins over the best baseline (the seeds that ended), best first."""
    rows = []
    for point in points:
        mine = [r for r in runs if r["settings"] == [*args.sets, *point] and "error" not in r]
        if not mine:
            continue
        margins = [margin(r["evaluation"]) for r in mine]
        returns = [r["evaluation"]["policies"]["trained (greedy-π)"]["return"]["mean"]
                   for r in mine]  # fmt: skip
        rows.append({"settings": point, "margin_mean": float(np.mean(margins)),
                     "margins": margins, "returns": returns,
                     "seconds": [r["seconds"] for r in mine]})  # fmt: skip
    rows.sort(key=lambda row: -row["margin_mean"])
    return {"points": args.points, "ranking": rows, "runs": runs}


# ------------------------------------------------------------------------------ Gymnasium
# Each env's budget, the return every seed's greedy policy must reach within it, and
# the published PPO figure it is set against (mean ± std over seeds, as their authors give it).
GYM_TARGETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"budget": 500_000, "threshold": 475.0,
                    "reference": "reward threshold of the env"},
    "Acrobot-v1": {"budget": 500_000, "threshold": -90.0,
                   "reference": "CleanRL ppo.py, 500k: -86.36 ± 1.32"},
    "LunarLander-v3": {"budget": 1_000_000, "threshold": 200.0,
                       "reference": "rl-baselines3-zoo PPO, 1M: 242.1 ± 31.8"},
}  # fmt: skip


def gym_steps(env_id: str, sets: list[str]) -> int:
    """Steps of `trident train --env gymnasium:env_id` (its rows per Step as `sets` leave them)
    that fit the env's budget."""
    train = load_config(env={}, overrides=sets).train
    rows = (train.num_envs or HOST_NUM_ENVS) * train.rollout_len  # as envs.fit_to_env sizes it
    return max(1, GYM_TARGETS[env_id]["budget"] // rows)  # 0 would be the backend's count


def served_gym_run(
    seed: int, sets: list[str], workdir: Path, timeout_s: float, env: str
) -> dict[str, Any]:
    """The gym job's training through the served path as a user runs it: `trident serve --env
    env` with `sets`, one `trident actor --env env` with no sizes (it sends the server's run:
    train.num_envs x rollout_len Steps until train.steps), then the job's own evaluation
    (service/jobs/gym.py) of the server's final checkpoint."""
    from service.checkpoint import load_policy, restore_checkpoint
    from service.jobs.gym import evaluate_policies
    from service.jobs.train import HELD_OUT
    from service.trainer.trainer import Trainer

    run_dir = Path(tempfile.mkdtemp(prefix=f"served{seed}-", dir=workdir))
    checkpoints = run_dir / "checkpoints"
    started = time.perf_counter()
    with ServerProcess.start(
        run_dir, [f"train.seed={seed}", *sets], checkpoint_dir=checkpoints,
        extra_args=("--env", env), startup_timeout_s=120.0,
    ) as server:  # fmt: skip
        command = [sys.executable, "-m", "service.cli", "actor", "--server", server.target,
                   "--env", env, "--seed", str(seed)]  # fmt: skip
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}
        done = subprocess.run(command, cwd=run_dir, env=environ, capture_output=True, text=True,
                              timeout=timeout_s)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} exited {done.returncode}:\n{done.stderr}")
        trained_s = time.perf_counter() - started
        with TridentClient(server.target, timeout_s=600.0) as client:
            final = client.checkpoint("served")
    config, _ = load_policy(checkpoints, final.name)
    trainer = Trainer(config)
    restore_checkpoint(trainer, checkpoints, final.name)
    report = evaluate_policies(trainer, env.removeprefix("gymnasium:"), seed + HELD_OUT)
    report.write(run_dir)
    lines = done.stdout.splitlines()
    summary = next(line for line in lines if line.startswith("done: "))
    env_steps = int(summary.split(" env steps")[0].rsplit(" ", 1)[1])
    return {"seed": seed, "settings": sets, "env": env, "via": "served",
            "seconds": round(time.perf_counter() - started, 1), "training_s": round(trained_s, 1),
            "steps": final.global_step, "job": lines[0] if lines else "",
            "stdout_tail": lines[-12:], "evaluation": json.loads((run_dir / EVAL_JSON).read_text()),
            "curve": [[env_steps, None]]}  # fmt: skip


def gym(args: argparse.Namespace) -> dict[str, Any]:
    """Every env × point × seed as `trident train --env gymnasium:ID` within the env's budget:
    the held-out evaluation of greedy-π, sampled-π and random (100 fresh episodes each)."""
    points = [point.split() for point in args.points]
    jobs = []
    for env_id in args.envs:
        for point in points:
            sets = [*args.sets, *point]
            sets.append(f"train.steps={gym_steps(env_id, sets)}")
            jobs += [(seed, sets, f"gymnasium:{env_id}") for seed in args.seeds]

    def summarize(runs: list[dict]) -> dict[str, Any]:
        return {"targets": GYM_TARGETS, "points": args.points, "table": gym_table(runs),
                "runs": sorted(runs, key=lambda r: (r.get("env", ""), r["seed"]))}

    result = run_all(jobs, args, summarize)
    print(f"\n{'env':<16} {'settings':<28} {'seeds':>5} {'env steps':>10} {'wall s':>7} "
          f"{'greedy-π (per seed)':<34} {'random':>8} {'target':>7} {'met':>4}  reference")
    for row in result["table"]:
        per_seed = ", ".join(f"{value:.1f}" for value in row["greedy"])
        print(f"{row['env']:<16} {' '.join(row['settings']) or '(defaults)':<28} "
              f"{len(row['greedy']):>5} {row['env_steps']:>10,} {np.mean(row['seconds']):7.0f} "
              f"{np.mean(row['greedy']):8.1f} [{per_seed}]{'':<{max(0, 24 - len(per_seed))}} "
              f"{np.mean(row['random']):8.1f} {row['threshold']:7g} "
              f"{'yes' if row['met'] else 'no':>4}  {row['reference']}")  # fmt: skip
    return result


def gym_table(runs: list[dict]) -> list[dict[str, Any]]:
    """Per env and settings: each seed's greedy-π and random mean returns, and whether every
    seed reached the env's threshold."""
    rows: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
    for run in runs:
        if "error" in run:
            continue
        env_id = run["env"].removeprefix("gymnasium:")
        point = tuple(s for s in run["settings"] if not s.startswith("train.steps="))
        row = rows.setdefault((env_id, point), {
            "env": env_id, "settings": list(point), "greedy": [], "sampled": [], "random": [],
            "seconds": [], "env_steps": 0, **GYM_TARGETS[env_id]})  # fmt: skip
        returns = run["evaluation"]["returns"]
        row["greedy"].append(returns["greedy-π"]["mean"])
        row["sampled"].append(returns["sampled-π"]["mean"])
        row["random"].append(returns["random"]["mean"])
        row["seconds"].append(run["seconds"])
        row["env_steps"] = run["curve"][-1][0] if run["curve"] else 0
    for row in rows.values():
        row["met"] = min(row["greedy"]) >= row["threshold"]
    return sorted(rows.values(), key=lambda row: (row["env"], -np.mean(row["greedy"])))


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("cartpole", "lobsim", "sweep", "gym"):
        sub = commands.add_parser(name)
        sub.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        sub.add_argument("--set", dest="sets", action="append", default=[],
                         metavar="SECTION.KEY=VALUE")  # fmt: skip
        sub.add_argument("--out", type=Path, required=True, help="JSON result file")
        if name == "cartpole":
            sub.add_argument("--num-envs", type=int, default=8)
            sub.add_argument("--rollout-len", type=int, default=128)
            sub.add_argument("--budget", type=int, default=1_000_000, help="env steps per seed")
            sub.add_argument("--via", choices=sorted(PATHS), default="actor",
                             help="how the actor talks to the server")  # fmt: skip
            sub.add_argument("--env-groups", type=int, default=1, help="with --via actor")
        else:
            sub.add_argument("--workers", type=int, default=1, help="runs at a time")
        if name != "cartpole":
            sub.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
        if name == "gym":
            sub.add_argument("--via", choices=("in-process", "served"), default="in-process",
                             help="served: trident serve --env and one trident actor with no "
                             "sizes, then the job's evaluation of the server's checkpoint")
            sub.add_argument("--envs", nargs="+", choices=sorted(GYM_TARGETS),
                             default=list(GYM_TARGETS), help="Gymnasium ids")  # fmt: skip
            sub.add_argument("--point", dest="points", action="append", default=[],
                             metavar="'SECTION.KEY=VALUE ...'",
                             help="settings on top of the defaults (default: the defaults)")
        if name == "lobsim":
            sub.add_argument("--via", choices=("in-process", "served"), default="in-process",
                             help="served: the job's training through trident serve and an "
                             "Interact actor")  # fmt: skip
            sub.add_argument("--env-groups", type=int, default=1, help="with --via served")
            sub.add_argument("--synchronous", action="store_true",
                             help="with --via served: each rollout's first actions wait for "
                             "the previous Step (no policy lag)")  # fmt: skip
            sub.add_argument("--actors", type=int,
                             help="with --via served: that many `trident actor` processes "
                             "sharing the job's markets (default: one actor in this process)")
        if name == "sweep":
            sub.add_argument("--point", dest="points", action="append", required=True,
                             metavar="'SECTION.KEY=VALUE ...'")  # fmt: skip
    return parser.parse_args(argv)


def write(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The JSON record: the command, when, the machine and versions, and `result`."""
    record = {
        "command": shlex.join(["python3", "bench/learning.py", *args.argv]),
        "started_utc": args.started.isoformat(timespec="seconds"),
        "machine": host_report.machine(),
        "versions": host_report.versions(["numpy", "grpcio", "cupy-cuda13x"]),
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv, args.started = list(argv or sys.argv[1:]), dt.datetime.now(dt.UTC)
    if args.command == "gym" and not args.points:
        args.points = [""]
    commands = {"cartpole": cartpole, "lobsim": lobsim, "sweep": sweep, "gym": gym}
    result = commands[args.command](args)
    write(args, result)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
