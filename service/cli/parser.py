"""`trident`'s argument parser: one builder per command, the help formatter that shows every
default, and the flags the commands share."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from service import trident_version
from service.client.client import DEFAULT_PORT
from service.config import SERVE_CHECKPOINT_DIR, Config
from service.config_sizes import BACKEND_DEFAULTS
from service.jobs import evaluate
from service.types import ActMode

DESCRIPTION = """\
Trident: a reinforcement-learning trainer (C51, PPO and value heads on one encoder) and the
gRPC service around it. `trident COMMAND --help` describes a command's options; `trident
config` lists every setting (--set section.key=value) with its default."""

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
    _train_command(commands)
    _eval_command(commands)
    _config_command(commands)
    _serve_command(commands)
    _status_command(commands)
    _health_command(commands)
    _act_command(commands)
    _checkpoint_command(commands)
    _actor_command(commands)
    _token_command(commands)
    _export_command(commands)
    return parser


def _train_command(commands: Any) -> None:
    """`trident train`: a job in-process, into a run folder."""
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


def _eval_command(commands: Any) -> None:
    """`trident eval`: a LobSim checkpoint against the baselines."""
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


def _config_command(commands: Any) -> None:
    """`trident config`: every setting with its doc."""
    config_cmd = commands.add_parser(
        "config",
        help="print every setting with its default and what it does (TOML, as --config reads)",
        description="Print every setting of the typed config (service/config.py) as TOML: "
        "each under its doc, its type and the values it allows. With --config and --set (and "
        "TRIDENT_<SECTION>__<KEY> variables), the values they make, the default beside each "
        "that differs. server.auth_token is never printed.",
    )
    _add_config_flags(config_cmd)


def _serve_command(commands: Any) -> None:
    """`trident serve`: the gRPC trainer service."""
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


def _status_command(commands: Any) -> None:
    """`trident status`: the server's summary, or every field."""
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


def _health_command(commands: Any) -> None:
    """`trident health`: the server's health."""
    health = commands.add_parser(
        "health", help="print the server's health (SERVING, NOT_SERVING); exit 0 when SERVING"
    )
    _add_client_flags(health)


def _act_command(commands: Any) -> None:
    """`trident act`: actions for a .npy file of observations."""
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


def _checkpoint_command(commands: Any) -> None:
    """`trident checkpoint save | list | restore`."""
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


def _actor_command(commands: Any) -> None:
    """`trident actor`: environments here, trained by a server."""
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


def _token_command(commands: Any) -> None:
    """`trident token`: a bearer token with a role."""
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


def _export_command(commands: Any) -> None:
    """`trident export`: a checkpoint's policy as ONNX."""
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
