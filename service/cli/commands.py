"""`trident` command line: each command's work.

`trident train` runs the main job in-process; `trident serve` runs the gRPC trainer service;
`status`, `act`, `checkpoint` and `health` talk to a running server; `trident actor` runs
environments that a running server trains on (service/actor/); `trident config` prints every
setting with its default and doc.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from service.actor import ActorOptions, run_actor
from service.api.messages import to_plain
from service.backend import resolve_name
from service.cli.parser import SERVE_FLAGS, build_parser
from service.client.client import DEFAULT_PORT, TridentClient, answered, channel_credentials
from service.client.observations import load_observations
from service.config import Config, ConfigError, load_config
from service.config_docs import documented_toml
from service.config_sizes import lobsim_job_settings
from service.envs import GYMNASIUM, check_env_name, fit_to_env
from service.errors import TridentError
from service.jobs import evaluate
from service.jobs.bandit import run_train_bandit
from service.jobs.run_folder import RunFolder, new_run_dir
from service.jobs.train import run_train_lobsim
from service.trainer.trainer import Trainer
from service.types import ActMode

UNAVAILABLE, DEADLINE_EXCEEDED = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED


def run_folder_of(path: str) -> RunFolder | None:
    """`path` as a run folder of `trident train`, when it is one (a folder holding a run's
    traces, and not a checkpoint's folder); None otherwise."""
    folder = RunFolder(Path(path))
    if (folder.root / "manifest.json").exists() or not folder.traces():
        return None
    return folder


def newest_of_run(folder: RunFolder, command: str) -> tuple[Path, str]:
    """The checkpoint root and name of the run's newest committed checkpoint, said on stdout;
    InvalidInput where it has none."""
    from service.checkpoint import latest_checkpoint
    from service.errors import InvalidInput

    saved = load_config(folder.config) if folder.config.is_file() else Config()
    root = folder.checkpoint_dir(saved)
    newest = latest_checkpoint(root)
    if newest is None:
        raise InvalidInput("CHECKPOINT", f"a run folder with a committed checkpoint (in {root})",
                           f"{folder.root}, which holds none")  # fmt: skip
    print(f"trident {command}: run folder {folder.root}: its newest checkpoint, {newest.name} "
          f"(step {newest.global_step})", flush=True)  # fmt: skip
    return root, newest.name


def run_eval(args: argparse.Namespace) -> int:
    """Play a LobSim checkpoint's greedy-π policy and the baselines on the same held-out
    markets (evaluate.compare); print the tables and the verdict, write the JSON and the PNG.
    A run folder (without --checkpoint-dir) stands for its newest checkpoint, played on the
    run's markets (its config.toml, unless --config)."""
    from dataclasses import replace

    from service.checkpoint import check_compatible, load_policy
    from service.config import with_overrides
    from service.errors import InvalidInput
    from service.jobs.train import HELD_OUT, lobsim_model

    if args.episodes < 2:
        raise InvalidInput("--episodes", "an integer >= 2 (an interval needs two markets)",
                           args.episodes)  # fmt: skip
    if args.tune_markets < 2:
        raise InvalidInput("--tune-markets", "an integer >= 2", args.tune_markets)
    run = None if args.checkpoint_dir else run_folder_of(args.checkpoint)
    config_file = args.config
    if run is not None and config_file is None and run.config.is_file():
        config_file = str(run.config)  # the markets the run trained on and evaluated
    config = load_config(config_file, overrides=args.overrides)
    if run is not None:
        root, name = newest_of_run(run, "eval")
        checkpoint, label = root / name, name
    else:
        checkpoint = Path(args.checkpoint_dir or config.checkpoint.dir or ".", args.checkpoint)
        label = args.checkpoint
    saved, params = load_policy(checkpoint.parent, checkpoint.name)
    markets = lobsim_model(replace(saved, lobsim=config.lobsim))
    sizes = ("obs_dim", "num_actions", "aux_dim")
    # LobSim's actions and labels fix these two whatever the market settings (obs_dim follows
    # lobsim.visible_levels: check_compatible names it below)
    if any(getattr(saved.model, k) != getattr(markets.model, k) for k in sizes[1:]):
        wanted = ", ".join(f"{k} {getattr(markets.model, k)}" for k in sizes)
        got = ", ".join(f"{k} {getattr(saved.model, k)}" for k in sizes)
        raise InvalidInput(
            "CHECKPOINT", f"a LobSim checkpoint: trident eval plays LobSim markets (model {wanted})"
            "; a Gymnasium run is evaluated by trident train, in its run folder's eval.json",
            f"a model of {got}",
        )  # fmt: skip
    # the checkpoint's model must be shaped for the markets of this config
    check_compatible(saved, markets, label)
    train_seed = saved.train.seed
    seed = train_seed + HELD_OUT if args.seed is None else args.seed
    if seed == train_seed:
        raise InvalidInput("--seed", f"a held-out seed other than the checkpoint's train.seed "
                           f"{train_seed} (Avellaneda-Stoikov is tuned there)", seed)  # fmt: skip
    no_replay = ["replay.capacity=1", "replay.batch_size=1", "replay.min_size=1"]  # Act only
    trainer = Trainer(with_overrides(saved, [f"train.backend={config.train.backend}", *no_replay]))
    trainer.load_params(params)
    agent = lambda obs, mask: trainer.act(obs, ActMode.GREEDY_PI).actions  # noqa: E731
    print(
        f"trident eval: checkpoint {checkpoint}, {args.episodes} held-out markets, "
        f"seed {seed}, horizon {config.lobsim.horizon}",
        flush=True,
    )
    out_dir = Path(args.out_dir)
    report = evaluate.compare(
        lambda env: agent, config.lobsim, seed, train_seed, markets=args.episodes,
        out_dir=out_dir, grid=evaluate.ASGrid(markets_per_pair=args.tune_markets),
        title=label, progress=sys.stdout,
    )  # fmt: skip
    print(report.text())
    names = (evaluate.JSON_NAME, evaluate.TEXT_NAME, evaluate.PNG_NAME)
    print(f"evaluation -> {', '.join(str(out_dir / name) for name in names)}", flush=True)
    return 0


def run_train(args: argparse.Namespace) -> int:
    """`trident train`: the main job (LobSim), a Gymnasium job or the bandit job, into a run
    folder: a new one, or one that holds no run yet, unless `--resume` goes on with its run or
    `--overwrite` clears it."""
    from service.errors import InvalidInput

    config_file = args.config
    if args.resume and args.run_dir and config_file is None:
        # Going on with a run: its own settings (the --set flags still apply on top).
        saved = Path(args.run_dir) / "config.toml"
        config_file = str(saved) if saved.is_file() else None
    config = load_config(config_file, overrides=args.overrides)
    if args.env == "lobsim" and not args.resume:
        # The main job's own settings, under the file, the environment and --set.
        job = lobsim_job_settings(resolve_name(config.train.backend))
        config = load_config(config_file, overrides=args.overrides, base=job)
    if args.resume and not (args.run_dir or config.checkpoint.dir):
        raise InvalidInput("--resume", "--run-dir naming the run to continue", "no --run-dir")
    if args.env != "bandit":
        check_env_name(args.env)  # lobsim or gymnasium:ID, before anything is written
    if args.env == "bandit" and (args.resume or args.tensorboard):
        flag = "--resume" if args.resume else "--tensorboard"
        raise InvalidInput(flag, "--env lobsim or gymnasium:ID (the bandit job has no per-Step "
                           "log)", "bandit")  # fmt: skip
    if args.overwrite and args.resume:
        raise InvalidInput("--overwrite", "it without --resume (--resume goes on with the run of "
                           "--run-dir, --overwrite deletes it)", "both")  # fmt: skip
    run_dir = Path(args.run_dir) if args.run_dir else new_run_dir(run_name(args.env))
    folder = RunFolder(run_dir)
    traces = folder.traces()
    if traces and not args.resume:
        if not args.overwrite:
            raise ConfigError(
                f"--run-dir {run_dir} holds a run already ({', '.join(traces)}): one run per "
                "folder. --resume goes on with it; --overwrite deletes it and starts afresh; or "
                "name another --run-dir"
            )
        folder.clear()
        print(f"trident train: --overwrite: deleted the run in {run_dir} ({', '.join(traces)})",
              flush=True)  # fmt: skip
    if args.env == "bandit":
        return run_train_bandit(config, run_dir, write_checkpoint=not args.no_checkpoint)
    tensorboard = Path(args.tensorboard) if args.tensorboard else None
    if args.env != "lobsim":
        from service.jobs.gym import run_train_gym

        return run_train_gym(config, args.env, run_dir, not args.no_checkpoint, args.resume,
                             tensorboard)  # fmt: skip
    return run_train_lobsim(config, run_dir, not args.no_checkpoint, args.resume, tensorboard)


def run_name(env: str) -> str:
    """A run folder's stem for `env`: gymnasium:CartPole-v1 -> CartPole-v1."""
    return env.removeprefix(GYMNASIUM).replace("/", "-")


def run_export(args: argparse.Namespace) -> int:
    """Write a checkpoint's policy as a model file (service/export.py: inputs and outputs); a
    run folder (without --checkpoint-dir) stands for its newest checkpoint."""
    try:
        from service.export import export
    except ImportError as error:  # the export extra is optional
        print(f"trident: error: export needs the {error.name} package: pip install onnx "
              "(the export extra)", file=sys.stderr)  # fmt: skip
        return 2
    run = None if args.checkpoint_dir else run_folder_of(args.checkpoint)
    if run is not None:
        root, name = newest_of_run(run, "export")
        checkpoint = root / name
    else:
        checkpoint = Path(args.checkpoint_dir or load_config().checkpoint.dir or ".",
                          args.checkpoint)  # fmt: skip
    path = export(checkpoint.parent, checkpoint.name, args.format, args.out)
    print(f"trident export: {checkpoint} -> {path}", flush=True)
    return 0


def run_token(args: argparse.Namespace) -> int:
    from service.server.auth import new_token, token_line

    secret = new_token()
    path = Path(args.tokens_file)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(descriptor, "a") as tokens:
        tokens.write(token_line(args.role, secret) + "\n")
    print(secret)
    print(f"trident token: a token of role {args.role}; its hash appended to {path} (restart "
          "the server to load it)", file=sys.stderr)  # fmt: skip
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from service.backend.rendezvous import ENV_RANK, Topology
    from service.server.app import serve  # the server's dependencies load only when serving

    flags = {}
    for flag, (setting, _, _) in SERVE_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            flags[flag] = (setting, str(value))
    if args.auth_token_file is not None:
        flags["--auth-token-file"] = ("server.auth_token", _read_token(args.auth_token_file))
    if args.gpus is not None:
        if args.world_size is not None or args.backend not in (None, "cuda"):
            raise ConfigError("--gpus N: one rank per GPU on the cuda backend; expected it "
                              "without --world-size and --backend")  # fmt: skip
        flags["--gpus"] = ("server.world_size", str(args.gpus))
    backend = ["train.backend=cuda"] if args.gpus is not None else []  # after the user's --set
    if args.resume:
        flags["--resume"] = ("checkpoint.resume", "true")
    config = load_config(args.config, overrides=[*args.overrides, *backend], flags=flags)
    if args.env is not None:
        config = fit_to_env(config, args.env)
    # checkpoint.resume set elsewhere (the image's environment) yields to an explicit --restore
    # or --inference-only; the --resume flag with either is refused
    explicit = args.restore is not None or args.inference_only
    resume = args.resume or (config.checkpoint.resume and not explicit)
    # Ranks on several hosts: each process is told its place by TRIDENT_RANK & co.
    topology = Topology.from_env(os.environ) if ENV_RANK in os.environ else None
    return serve(
        config,
        inference_only=args.inference_only,
        restore=args.restore,
        resume=resume,
        topology=topology,
    )


def _read_token(path: str) -> str:
    """The token in `path`, without the line break an editor or `echo` leaves."""
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"--auth-token-file {path}: expected a readable text file ({error})"
        ) from None
    if not token:
        raise ConfigError(f"--auth-token-file {path}: expected a token, got an empty file")
    return token


def _client(args: argparse.Namespace) -> TridentClient:
    credentials = None
    if args.tls_ca or args.tls_cert:
        credentials = channel_credentials(args.tls_ca, args.tls_cert, args.tls_key)
    token = args.token or os.environ.get("TRIDENT_TOKEN")
    return TridentClient(args.server, token=token, credentials=credentials, timeout_s=args.timeout)


def _rpc_failure(error: grpc.RpcError, target: str, args: argparse.Namespace) -> str:
    """The line to print for a failed call: the server's own status and message, or, when no
    server answered, which address was tried and what to check."""
    code, details = error.code(), error.details() or ""
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return f"{code.name}: {details} (pass the server's token: --token or $TRIDENT_TOKEN)"
    if answered(error) or code not in (UNAVAILABLE, DEADLINE_EXCEEDED):
        return f"{code.name}: {details}"
    if code is DEADLINE_EXCEEDED:
        return (
            f"no answer from {target} within {args.timeout:g} s (--timeout): the server is busy, "
            "or cannot be reached from here (a firewall, a wrong --server)"
        )
    if "Connection refused" in details:
        why = "connection refused (nothing listens on that port)"
    elif "resolv" in details:
        why = "the host name does not resolve"
    elif "andshake" in details or "Socket closed" in details:
        why = "the connection failed during the TLS handshake"
    else:
        why = f"gRPC says: {details}"
    tls = (
        "the server serves TLS with a certificate that --tls-ca signed for that host name, "
        "and for mTLS that --tls-cert / --tls-key hold a client certificate it trusts (drop "
        "--tls-ca for a plaintext server)"
        if args.tls_ca
        else "the server is plaintext (a TLS server needs --tls-ca)"
    )
    return (
        f"cannot reach a Trident server at {target}: {why}. Check that `trident serve` runs "
        f"there on that port (--server HOST[:PORT]; PORT defaults to {DEFAULT_PORT}), and that "
        f"{tls}"
    )


def run_remote(
    args: argparse.Namespace, command: Callable[[argparse.Namespace, TridentClient], int]
) -> int:
    """Run a command that talks to a server; a failed call prints one line (exit 1)."""
    with _client(args) as client:
        try:
            return command(args, client)
        except grpc.RpcError as error:
            print(f"trident: error: {_rpc_failure(error, client.target, args)}", file=sys.stderr)
            return 1


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def run_client(args: argparse.Namespace, client: TridentClient) -> int:
    if args.command == "health":
        health = client.health()
        print(health)
        return 0 if health == "SERVING" else 1
    if args.command == "status":
        reply = client.status()
        status = to_plain(reply)
        config = json.loads(status.pop("config_json") or "{}")
        if args.json:
            _print_json({**status, "config": config} if args.config else status)
            return 0
        print(status_summary(reply, config, client.target))
        if args.config:
            print(f"config: {json.dumps(config, indent=2, sort_keys=True)}")
    elif args.command == "act":
        obs, converted_from = load_observations(args.obs)
        if converted_from is not None:
            print(f"trident act: {args.obs} holds {converted_from} observations; sending them "
                  "as float32", file=sys.stderr)  # fmt: skip
        result = client.act(obs, ActMode(args.mode), args.epsilon)
        _print_json(
            {
                "actions": result.actions.tolist(),
                "log_probs": result.log_probs.tolist(),
                "values": result.values.tolist(),
                "policy_version": result.policy_version,
            }
        )
    elif args.action == "save":
        _print_json(to_plain(client.checkpoint(args.name)))
    elif args.action == "list":
        _print_json([to_plain(info) for info in client.list_checkpoints()])
    else:
        _print_json(to_plain(client.restore(args.name)))
    return 0


IDLE_S = 60.0  # `trident status` calls a server idle when its newest Step is older than this


def status_summary(status: Any, config: dict[str, Any], target: str) -> str:
    """`trident status`'s lines: what the server is doing and how far it is, from GetStatus
    (`status`) and its configuration."""
    since = status.seconds_since_step if status.HasField("seconds_since_step") else None
    if status.inference_only:
        state = "inference-only: answers Act, trains nothing"
    elif since is None:
        state = "waiting for its first Step"
    elif since <= IDLE_S:
        state = f"training (last Step {since:.1f} s ago)"
    else:
        state = f"idle (last Step {_ago(since)} ago)"
    train, model = config.get("train", {}), config.get("model", {})
    until = f" of {train['steps']} (train.steps)" if train.get("steps") else ""
    if status.checkpoint_name:
        age = _ago(status.checkpoint_age_s) if status.HasField("checkpoint_age_s") else "?"
        checkpoint = (f"{status.checkpoint_name}, {age} ago (holds every Step up to "
                      f"{status.checkpoint_step})")  # fmt: skip
    else:
        every = config.get("checkpoint", {}).get("every_s", 0)
        checkpoint = "none yet" + (f" (one every {every:g} s of training)" if every else "")
    rows = {
        "state": state,
        "step": f"{status.global_step}{until}",
        "rate": f"{status.env_steps_per_s:.0f} env steps/s over the last minute",
        "clients": f"{status.open_streams} Interact stream{'s' * (status.open_streams != 1)} "
        f"open; {status.step_queue_depth} waiting in the Step queue",
        "checkpoint": checkpoint,
        "schedule": f"{status.lr_schedule}; the next Step at learning rate "
        f"{status.learning_rate:.3g}",
        "model": f"obs_dim {model.get('obs_dim')}, {model.get('num_actions')} actions, aux_dim "
        f"{model.get('aux_dim')}, hidden {model.get('hidden_dim')}; replay "
        f"{status.replay_size} transitions",
        "server": f"trident {status.version}, {status.backend} on {status.device}, auth "
        f"{status.auth_mode}",
    }
    lines = [f"trident status of {target}:"]
    lines += [f"  {name:<11}{text}" for name, text in rows.items()]
    lines.append("  (--json: every field; --config: the whole configuration)")
    return "\n".join(lines)


def _ago(seconds: float) -> str:
    """`12.3 s`, `4.5 min` or `6.7 h`."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def run_actor_command(args: argparse.Namespace, client: TridentClient) -> int:
    lobsim = load_config(args.config, overrides=args.overrides).lobsim
    options = ActorOptions(
        num_envs=args.num_envs,
        steps=args.steps,
        rollout_len=args.rollout_len,
        seed=args.seed,
        log_every=args.log_every,
        duration_s=args.duration,
        reconnect_s=args.reconnect_timeout,
        env_groups=args.env_groups,
        synchronous=args.synchronous,
        wait_checkpoint=args.wait_checkpoint,
    )
    return run_actor(client, args.env, lobsim, options)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            return run_train(args)
        if args.command == "eval":
            return run_eval(args)
        if args.command == "serve":
            return run_serve(args)
        if args.command == "actor":
            return run_remote(args, run_actor_command)
        if args.command == "config":
            print(documented_toml(load_config(args.config, overrides=args.overrides)), end="")
            return 0
        if args.command == "export":
            return run_export(args)
        if args.command == "token":
            return run_token(args)
        return run_remote(args, run_client)
    except (ConfigError, TridentError, OSError) as error:
        print(f"trident: error: {error}", file=sys.stderr)
        return 2

