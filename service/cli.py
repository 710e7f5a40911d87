"""`trident` command line.

`trident train` runs the main job in-process; `trident serve` runs the gRPC trainer service;
`status`, `act`, `checkpoint` and `health` talk to a running server; `trident actor` runs
environments that a running server trains on (service/actor.py); `trident config` prints every
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

from service import trident_version
from service.actor import run_actor
from service.api.messages import to_plain
from service.client.client import DEFAULT_PORT, TridentClient, answered, channel_credentials
from service.client.observations import load_observations
from service.config import (
    BACKEND_DEFAULTS,
    SERVE_CHECKPOINT_DIR,
    Config,
    ConfigError,
    documented_toml,
    load_config,
)
from service.envs import GYMNASIUM, check_env_name, fit_to_env
from service.errors import TridentError
from service.jobs import evaluate
from service.jobs.bandit import run_train_bandit
from service.jobs.run_folder import RunFolder, new_run_dir
from service.jobs.train import run_train_lobsim
from service.trainer.trainer import Trainer
from service.types import ActMode

DESCRIPTION = """\
Trident: a reinforcement-learning trainer (C51, PPO and value heads on one encoder) and the
gRPC service around it. `trident COMMAND --help` describes a command's options; `trident
config` lists every setting (--set section.key=value) with its default."""

UNAVAILABLE, DEADLINE_EXCEEDED = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED

# `trident serve` options that stand for one setting each: flag -> (setting, metavar, what it
# is). A value given here beats --set, the config file and TRIDENT_* variables; an error names
# the flag.
SERVE_FLAGS = {
    "--host": ("server.host", "HOST", "bind address"),
    "--port": ("server.port", "PORT", "gRPC port; 0 picks a free one"),
    "--unix-socket": (
        "server.unix_socket", "PATH", "also listen on this Unix-domain socket (actors on this "
        "host: --server unix:PATH)"
    ),
    "--metrics-port": ("server.metrics_port", "PORT", "Prometheus port; 0 picks a free one"),
    "--checkpoint-dir": (
        "checkpoint.dir", "DIR", "checkpoint root (default runs/serve-<port>/checkpoints)"
    ),
    "--backend": ("train.backend", "NAME", "auto (cuda where CuPy sees a GPU), numpy or cuda"),
    "--tls-cert": ("server.tls_cert", "PEM", "server certificate; with --tls-key, serves TLS"),
    "--tls-key": ("server.tls_key", "PEM", "server private key"),
    "--tls-ca": ("server.tls_client_ca", "PEM", "CA of client certificates; requires them (mTLS)"),
    "--world-size": (
        "server.world_size", "N", "ranks on this host, each a process with its share of every "
        "Step (train.data_shards a multiple of N)"
    ),
    "--auth-tokens-file": (
        "server.auth_tokens_file", "FILE", "role tokens: '<role> sha256:<hex>' (trident token)"
    ),
}  # fmt: skip


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, except where there is none to show (None, an
    off switch, an empty list); descriptions and epilogs keep their line breaks."""

    # argparse's hook for the defaults (ArgumentDefaultsHelpFormatter overrides it too)
    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose subcommands' parsers are built with the same help formatter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", _CommandParser)
        return super().add_subparsers(**kwargs)


class _CommandParser(_Parser):
    """A subcommand's parser: an argument it does not know is refused with its own usage.
    (argparse hands a subcommand's leftovers up to the top-level parser, whose usage says
    nothing of the subcommand's options.)"""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def _setting_help(text: str, setting: str) -> str:
    """`text`, the setting an option stands for and the setting's default."""
    section, key = setting.split(".")
    default = getattr(getattr(Config(), section), key)
    return f"{text} ({setting}; default: {default})" if default != "" else f"{text} ({setting})"


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML config file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting (repeatable); beats the file and TRIDENT_* variables. "
        "`trident config` lists every setting with its default",
    )


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=f"127.0.0.1:{DEFAULT_PORT}",
        metavar="HOST[:PORT]",
        help=f"the server's address; PORT defaults to {DEFAULT_PORT}",
    )
    parser.add_argument(
        "--token", help="bearer token, when the server requires one (default: $TRIDENT_TOKEN)"
    )
    parser.add_argument("--tls-ca", metavar="PEM", help="CA that signed the server's certificate; "
                        "connects with TLS (without it: plaintext)")  # fmt: skip
    parser.add_argument("--tls-cert", metavar="PEM", help="client certificate (mTLS)")
    parser.add_argument("--tls-key", metavar="PEM", help="client private key (mTLS)")
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline per call (s)")


def serve_description() -> str:
    """What a plain `trident serve` runs, from the config's defaults: a line per concern."""
    import textwrap

    config = Config()
    model, train, checkpoint, server = config.model, config.train, config.checkpoint, config.server
    numpy, cuda = BACKEND_DEFAULTS["numpy"], BACKEND_DEFAULTS["cuda"]
    rows = {
        "model": f"model.obs_dim {model.obs_dim}, num_actions {model.num_actions}, aux_dim "
        f"{model.aux_dim} (LobSim's); hidden_dim {numpy['model.hidden_dim']:g} on NumPy, "
        f"{cuda['model.hidden_dim']:g} on CUDA",
        "Steps": f"train.num_envs columns at least ({numpy['train.num_envs']:g} on NumPy, "
        f"{cuda['train.num_envs']:g} on CUDA) x train.rollout_len {train.rollout_len} env steps",
        "run": f"train.steps {train.steps}: no end, at optim.lr ({numpy['optim.lr']:g} on NumPy, "
        f"{cuda['optim.lr']:g} on CUDA); with train.steps N the rate anneals over N Steps, "
        "actors stop there and the server commits a checkpoint",
        "checkpoints": f"every {checkpoint.every_s:g} s (checkpoint.every_s) into "
        f"{SERVE_CHECKPOINT_DIR.format(port='<port>')}, the newest {checkpoint.keep_last} "
        "kept; SIGTERM drains and commits what is new since the last",
        "address": f"{server.host}:{server.port}, metrics on port {server.metrics_port}; logs "
        "are JSON lines on stderr",
    }
    lines = textwrap.wrap("Run the gRPC trainer service. With no settings it trains what "
                          "`trident actor --env lobsim` sends (the main job's market maker) "
                          "until stopped:", 96)  # fmt: skip
    for name, text in rows.items():
        lines += textwrap.wrap(text, 96, initial_indent=f"  {name:<12}",
                               subsequent_indent=" " * 14)  # fmt: skip
    lines.append("--env gymnasium:ID fits the model to another env; `trident config` lists "
                 "every setting.")  # fmt: skip
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trident", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"trident {trident_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train_cmd = commands.add_parser(
        "train", help="train in-process: LobSim (the main job), any Gymnasium env "
        "(--env gymnasium:ID) or the contextual bandit"
    )  # fmt: skip
    _add_config_flags(train_cmd)
    train_cmd.add_argument(
        "--env",
        default="lobsim",
        help="environment: lobsim (limit-order-book markets), bandit (contextual bandit), or "
        "gymnasium:ID (any Gymnasium env with Discrete actions; the model's sizes from its "
        "spaces; pip install '.[gym]')",
    )
    train_cmd.add_argument(
        "--no-checkpoint",
        action="store_true",
        help="write no checkpoint when training ends (a stop during training still saves one "
        "where it stopped; a stop during the evaluation then keeps nothing)",
    )
    train_cmd.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        metavar="NAME",
        help="lobsim, gymnasium: go on with the run of --run-dir (its config.toml unless "
        "--config) from its newest checkpoint (or NAME), exactly where it stopped, up to "
        "train.steps; a run whose training is done is evaluated",
    )
    train_cmd.add_argument(
        "--run-dir",
        metavar="DIR",
        help="run folder: config.toml, checkpoints/ (unless checkpoint.dir is set) and for "
        "lobsim and gymnasium train.csv, train.png, eval.json, eval.txt (lobsim: eval.png) "
        "(default: runs/<env>-<UTC time>, printed at the start). One run per folder: a folder "
        "that holds a run takes --resume or --overwrite",
    )
    train_cmd.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in a --run-dir that holds a run: delete its config.toml, train.csv, "
        "train.png, eval.* and checkpoints/ first",
    )
    train_cmd.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="lobsim: also write every train.csv column as TensorBoard scalars train/<column> "
        "to DIR (pip install '.[tensorboard]')",
    )

    eval_cmd = commands.add_parser(
        "eval",
        help="a LobSim checkpoint's greedy policy against baselines on held-out markets",
        description="Play a LobSim checkpoint's greedy policy and the baselines on the same "
        "held-out markets; print the table and the verdict, write eval.json, eval.txt and "
        "eval.png. Given a run folder, the run's newest checkpoint on the run's markets (its "
        "config.toml unless --config).",
        epilog=evaluate.columns_help(),
    )
    _add_config_flags(eval_cmd)  # the lobsim section: the markets played
    eval_cmd.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a run folder of `trident train` (its newest checkpoint), a checkpoint's folder, "
        "as `trident train` prints it, or its name under --checkpoint-dir",
    )
    eval_cmd.add_argument(
        "--checkpoint-dir",
        help="where CHECKPOINT is (default checkpoint.dir, or the current directory where that "
        "is empty)",
    )
    eval_cmd.add_argument(
        "--episodes",
        type=int,
        default=evaluate.EVAL_MARKETS,
        help="held-out markets per policy, one episode each",
    )
    eval_cmd.add_argument(
        "--seed", type=int, help="market seed (default: the checkpoint's train.seed + 1000003)"
    )
    eval_cmd.add_argument(
        "--tune-markets",
        type=int,
        default=evaluate.ASGrid().markets_per_pair,
        help="training markets per Avellaneda-Stoikov (gamma, k) pair in its grid search",
    )
    eval_cmd.add_argument(
        "--out-dir",
        default="eval",
        help="directory for eval.json (every number), eval.txt (what is printed) and eval.png",
    )

    config_cmd = commands.add_parser(
        "config",
        help="print every setting with its default and what it does (TOML, as --config reads)",
        description="Print every setting of the typed config (service/config.py) as TOML: "
        "each under its doc, its type and the values it allows. With --config and --set (and "
        "TRIDENT_<SECTION>__<KEY> variables), the values they make, the default beside each "
        "that differs. server.auth_token is never printed.",
    )
    _add_config_flags(config_cmd)

    serve = commands.add_parser(
        "serve", help="run the gRPC trainer service", description=serve_description()
    )
    _add_config_flags(serve)
    for flag, (setting, metavar, text) in SERVE_FLAGS.items():
        kind = int if metavar == "PORT" else str
        serve.add_argument(flag, type=kind, metavar=metavar, help=_setting_help(text, setting))
    serve.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="file holding the bearer token clients must send (server.auth_token; a file keeps "
        "it out of the process list)",
    )
    serve.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="one rank per GPU of this host on the cuda backend, gradients summed over NCCL "
        "(server.world_size = N; train.data_shards a multiple of N)",
    )
    serve.add_argument(
        "--env",
        metavar="ENV",
        help="lobsim or gymnasium:ID: the model's sizes (model.obs_dim, num_actions, aux_dim) "
        "from the env its actors run",
    )
    serve.add_argument("--restore", metavar="NAME", help="restore this checkpoint at start")
    serve.add_argument(
        "--resume",
        action="store_true",
        help="restore the newest checkpoint of the checkpoint dir at start, if there is one "
        "(a restarted server carries on where its last checkpoint left off): checkpoint.resume",
    )
    serve.add_argument(
        "--inference-only",
        action="store_true",
        help="serve Act from --restore NAME, without optimizer state",
    )

    status = commands.add_parser(
        "status",
        help="print the server's status: what it is doing, its step and rate, its clients, "
        "its newest checkpoint and its schedule",
        description="A summary first: state (training, idle, waiting for its first Step, "
        "inference-only), global step, env steps per second over the last minute, Interact "
        "streams open and the Step queue, the newest checkpoint, the learning-rate schedule, "
        "the model and auth mode (never the token). --json prints every field as JSON, "
        "--config the whole effective configuration.",
    )
    _add_client_flags(status)
    status.add_argument("--json", action="store_true", help="every field of GetStatus as one "
                        "JSON object (the configuration too with --config)")  # fmt: skip
    status.add_argument("--config", action="store_true", help="also the whole effective "
                        "configuration (JSON, by section)")  # fmt: skip
    health = commands.add_parser(
        "health", help="print the server's health (SERVING, NOT_SERVING); exit 0 when SERVING"
    )
    _add_client_flags(health)
    act = commands.add_parser("act", help="ask the server for actions; prints JSON")
    _add_client_flags(act)
    act.add_argument(
        "obs",
        metavar="OBS.npy",
        help="observations [N, D], saved by numpy.save as float32 (other integer and float "
        "dtypes are converted, with a note on stderr)",
    )
    act.add_argument(
        "--mode",
        choices=[m.value for m in ActMode],
        default="sample",
        help="sample: draw from the policy; greedy_pi: its most likely action; greedy_q: the "
        "highest mean of the C51 Q head; epsilon_greedy: greedy_q, or a uniform random action "
        "with probability --epsilon",
    )
    act.add_argument(
        "--epsilon",
        type=float,
        default=0.0,
        help="random-action probability of --mode epsilon_greedy, in [0, 1]",
    )
    checkpoint = commands.add_parser("checkpoint", help="save, list or restore checkpoints")
    checkpoint_cmds = checkpoint.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, helptext in (
        ("save", "save the server's whole state; prints the checkpoint as JSON"),
        ("list", "list the server's checkpoints as JSON, newest first"),
        ("restore", "replace the server's state with a checkpoint; prints it and the "
         "parameter digest as JSON"),
    ):  # fmt: skip
        sub = checkpoint_cmds.add_parser(action, help=helptext)
        _add_client_flags(sub)
        if action == "save":
            sub.add_argument("--name", help="checkpoint name (default: step-<global step>)")
        if action == "restore":
            sub.add_argument("name", metavar="NAME", help="checkpoint name, as `list` prints it")
    actor = commands.add_parser(
        "actor", help="run N environments here, trained by a server (an Interact stream)"
    )
    _add_client_flags(actor)
    _add_config_flags(actor)  # the lobsim section, for --env lobsim
    actor.add_argument("--env", required=True, help="lobsim or gymnasium:ID (Discrete actions)")
    actor.add_argument("--num-envs", type=int, help="environments in this process (default: "
                       "the server's train.num_envs, the Steps `trident train` makes)")  # fmt: skip
    actor.add_argument("--steps", type=int, help="rollouts to send, then exit (default: until "
                       "the server's global step reaches its train.steps, the end of its "
                       "learning-rate schedule, whatever this actor's share of each Step and "
                       "whatever other actors send; a server without train.steps has no end: "
                       "until stopped)")  # fmt: skip
    actor.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="also exit after the first Step that ends this long after the start",
    )
    actor.add_argument(
        "--rollout-len",
        type=int,
        help="env steps per rollout (default: the server's train.rollout_len)",
    )
    actor.add_argument("--seed", type=int, default=0, help="environment seed")
    actor.add_argument("--log-every", type=int, default=10, help="answered rollouts between "
                       "progress lines (each gives the rate since the line before)")  # fmt: skip
    actor.add_argument(
        "--env-groups",
        type=int,
        default=1,
        help="groups the environments act in, one stepping while another's actions are in "
        "flight (pays where the server's round trip is long beside an env step)",
    )
    actor.add_argument(
        "--synchronous",
        action="store_true",
        help="act on a rollout's first observations only once the previous rollout's Step is "
        "applied: with one group and one actor, what Act x T then Step compute, byte for byte",
    )
    actor.add_argument(
        "--wait-checkpoint",
        action="store_true",
        help="before exiting, wait (up to --reconnect-timeout) until a checkpoint of the "
        "server's state holds every Step this actor had applied: one it asks for where the "
        "token may (Checkpoint: role admin), else the server's periodic ones",
    )
    actor.add_argument(
        "--reconnect-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for a server that went away (restart, drain, upgrade) before "
        "giving up; the environments wait where they are",
    )
    token = commands.add_parser(
        "token",
        help="make a bearer token with a role: prints the token once, appends its hash to the "
        "server's token file",
        description="Roles: actor (Act, Step, StreamStep, Interact, GetStatus), viewer "
        "(GetStatus, ListCheckpoints), admin (every method). The file keeps sha256 hashes, "
        "never tokens; serve it with `trident serve --auth-tokens-file FILE`.",
    )
    token.add_argument("--role", required=True, choices=("actor", "viewer", "admin"),
                       help="what the token may call")  # fmt: skip
    token.add_argument("--tokens-file", metavar="FILE", required=True,
                       help="token file to append the hash line to (created 0600)")  # fmt: skip
    export = commands.add_parser(
        "export", help="write a checkpoint's policy as an ONNX model for inference without Trident"
    )
    export.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a run folder of `trident train` (its newest checkpoint), a checkpoint's folder, "
        "as `trident train` prints it, or its name under --checkpoint-dir",
    )
    export.add_argument(
        "--format", default="onnx", help="model format; onnx only (default: %(default)s)"
    )
    export.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="where CHECKPOINT is (default checkpoint.dir, or the current directory where that "
        "is empty)",
    )
    export.add_argument(
        "--out",
        metavar="FILE",
        type=Path,
        help="where to write it (default: the checkpoint's name + .onnx, here)",
    )
    return parser


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
    return run_actor(
        client,
        args.env,
        lobsim,
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


if __name__ == "__main__":
    sys.exit(main())
