"""Typed Trident configuration.

Layering, lowest to highest precedence: dataclass defaults < a job's own settings < TOML file <
environment ``TRIDENT_<SECTION>__<KEY>`` < ``--set section.key=value`` overrides.
Each field declares its constraint once, next to it (``_f(default, ge=..., choices=...)``);
every section validates itself on construction, so invalid configs cannot exist.
"""

import difflib
import json
import math
import os
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "C51Config",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "ModelConfig",
    "OptimConfig",
    "PPOConfig",
    "ReplayConfig",
    "ServerConfig",
    "TrainConfig",
    "load_config",
    "with_checkpoint_dir",
    "with_overrides",
]

ENV_PREFIX = "TRIDENT_"
# `trident serve`'s checkpoint.dir when it is left empty, by its server.port: fixed, so a server
# restarted on its port finds its predecessor's checkpoints with `--restore NAME`; apart from
# training runs' folders and from another server's on this machine (a LobSim and a CartPole one)
SERVE_CHECKPOINT_DIR = "runs/serve-{port}/checkpoints"
_BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False,
               "yes": True, "no": False, "on": True, "off": False}


class ConfigError(ValueError):
    """Invalid configuration: unknown key, bad type/value, unreadable file, malformed flag."""


@dataclass(frozen=True, slots=True)
class _Rule:
    """Allowed values of one field: an interval (open or closed ends) or a set of choices."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple[str, ...] = ()

    def allows(self, v: Any) -> bool:
        if self.choices:
            return v in self.choices
        lo_ok = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
        hi_ok = self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)
        return lo_ok and hi_ok

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(map(repr, self.choices))
        if self.lo is not None and self.hi is not None:
            left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
            return f"in {left}{self.lo}, {self.hi}{right}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {self.lo}"
        return f"{'<' if self.hi_open else '<='} {self.hi}"


def _f(default: Any, *, ge: float | None = None, gt: float | None = None,
       le: float | None = None, lt: float | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A dataclass field with a default and a declared constraint."""
    rule = _Rule(lo=ge if gt is None else gt, hi=le if lt is None else lt,
                 lo_open=gt is not None, hi_open=lt is not None, choices=choices)
    return field(default=default, metadata={"rule": rule})


class _Section:
    """Mixin: type- and range-check every field after construction (ints widen to floats)."""

    __slots__ = ()

    def __post_init__(self) -> None:
        name = _SECTION_NAMES[type(self)]
        for f in fields(self):
            value = _check_value(f"{name}.{f.name}", f, getattr(self, f.name))
            object.__setattr__(self, f.name, value)


@dataclass(frozen=True, slots=True)
class ModelConfig(_Section):
    """Network shape and numeric precision."""

    # observation features D per env step; the default is LobSim's (4 · lobsim.visible_levels
    # + 16 at its 10 levels), so a plain `trident serve` fits `trident actor --env lobsim`
    obs_dim: int = _f(56, ge=1)
    hidden_dim: int = _f(0, ge=0)  # encoder/head hidden width (units); 0: BACKEND_DEFAULTS
    depth: int = _f(2, ge=1)  # encoder layers
    num_actions: int = _f(9, ge=1)  # discrete actions
    aux_dim: int = _f(3, ge=0)  # K auxiliary regression targets; 0 disables the aux head
    dtype: str = _f("float32", choices=("float32", "float64"))  # float64: numpy backend only


@dataclass(frozen=True, slots=True)
class TrainConfig(_Section):
    """Training loop, loss weights and rollout shape."""

    seed: int = _f(0, ge=0, lt=2**63)  # RNG seed for init, sampling and shuffling
    backend: str = _f("auto", choices=("auto", "numpy", "cuda"))  # compute backend
    cuda_graphs: bool = True  # cuda backend: replay each Step / Act shape as a captured graph
    gamma: float = _f(0.99, ge=0, le=1)  # discount factor per env step
    lambda_q: float = _f(0.0, ge=0)  # encoder-gradient weight of the C51 Q head
    lambda_pi: float = _f(1.0, ge=0)  # encoder-gradient weight of the policy head
    lambda_v: float = _f(0.5, ge=0)  # encoder-gradient weight of the value head
    lambda_bce: float = _f(0.1, ge=0)  # encoder-gradient weight of the BCE head
    lambda_aux: float = _f(0.1, ge=0)  # encoder-gradient weight of the aux regression head
    max_policy_lag: int = _f(4, ge=0)  # max policy versions a rollout may lag the learner
    # cuda: the GEMMs' arithmetic: 'fp32' (IEEE, what the NumPy twins match), 'tf32' or 'bf16'
    # (tensor cores, fp32 accumulation; parameters, moments and losses stay fp32)
    precision: str = _f("fp32", choices=("fp32", "tf32", "bf16"))
    # Data-parallel layout: a Step's environments, minibatches and replay split into this many
    # equal shards by environment column; each rank of a world of W holds data_shards / W of
    # them (W = 1 holds all: the same Step the ranks compute together)
    data_shards: int = _f(1, ge=1)
    # parallel environments per rollout of the `trident train` job, and a served Step's columns
    # at least (more while the open Interact streams hold more); 0: the backend's size
    # (BACKEND_DEFAULTS: a few hundred on NumPy, thousands on CUDA)
    num_envs: int = _f(0, ge=0)
    rollout_len: int = _f(32, ge=1)  # env steps per environment per rollout
    # Steps of a run: `trident train`'s (0: JOB_STEPS, the backend's), or a server's horizon
    # (its learning-rate schedule's; `trident actor` stops there by default). A server's 0 is a
    # run with no end, a service: the rate stays optim.lr and actors go on until stopped
    steps: int = _f(0, ge=0)
    # the learning rate over a run with train.steps: 'linear', optim.lr x (1 - done /
    # train.steps) before each Step (CleanRL's anneal_lr), or 'constant' (optim.lr); a run with
    # no end has no schedule to follow and trains at optim.lr
    lr_schedule: str = _f("linear", choices=("constant", "linear"))
    log_every: int = _f(20, ge=1)  # training steps between log lines


@dataclass(frozen=True, slots=True)
class PPOConfig(_Section):
    """Policy/value head (PPO) hyper-parameters."""

    gae_lambda: float = _f(0.95, ge=0, le=1)  # GAE lambda (bias/variance trade-off)
    clip_eps: float = _f(0.2, gt=0)  # policy ratio clip range (dimensionless)
    ent_coef: float = _f(0.01, ge=0)  # entropy bonus weight
    epochs: int = _f(4, ge=1)  # optimisation passes over each rollout
    num_minibatches: int = _f(8, ge=1)  # minibatches per epoch
    norm_adv: bool = True  # normalise advantages per minibatch
    clip_value_loss: bool = False  # use the clipped value loss
    value_clip_eps: float = _f(0.2, gt=0)  # value clip range (value-head units; see value_norm)
    # the value head predicts returns normalised by running statistics (trainer/value_norm.py)
    value_norm: bool = True
    value_norm_decay: float = _f(0.9, ge=0, lt=1)  # per Step: weight of the older statistics


@dataclass(frozen=True, slots=True)
class KickstartConfig(_Section):
    """Kickstarting (Schmitt et al. 2018): a cross-entropy pulling the policy head towards a
    teacher's action on the rollout's observations, weighted by coef at Step 0 and falling
    linearly to 0 over decay_steps Steps. The teacher reads the sign of one observation
    feature; the defaults are LobSim's inventory-skew rule (short: QUOTE(0,2), flat:
    QUOTE(0,0), long: QUOTE(2,0), on the inventory column)."""

    coef: float = _f(0.0, ge=0)  # the loss's weight at Step 0 (dimensionless); 0: off
    decay_steps: int = _f(0, ge=0)  # Steps over which the weight falls linearly to 0 (>= 1 on)
    # the observation column the teacher reads; -1: LobSim's inventory column, which the LobSim
    # job sets (a server with coef > 0 must name one)
    feature: int = _f(-1, ge=-1)
    action_below: int = _f(5, ge=-1)  # the teacher's action where the feature is < 0; -1: none
    action_zero: int = _f(2, ge=-1)  # the teacher's action where the feature is 0; -1: none
    action_above: int = _f(6, ge=-1)  # the teacher's action where the feature is > 0; -1: none


@dataclass(frozen=True, slots=True)
class C51Config(_Section):
    """Distributional Q head (C51) hyper-parameters."""

    num_atoms: int = _f(51, ge=2)  # support atoms of the return distribution
    v_min: float = -10.0  # lowest support value (return units)
    v_max: float = 10.0  # highest support value (return units), > v_min
    n_step: int = _f(1, ge=1)  # n-step return length (env steps)
    double_dqn: bool = False  # pick bootstrap actions with the online net
    target_update_period: int = _f(100, ge=1)  # updates between hard target copies
    target_tau: float = _f(0.0, ge=0, le=1)  # 0: hard copy; >0: Polyak factor per update


@dataclass(frozen=True, slots=True)
class OptimConfig(_Section):
    """AdamW optimiser and gradient clipping."""

    lr: float = _f(0.0, ge=0)  # learning rate (per update); 0: BACKEND_DEFAULTS
    beta1: float = _f(0.9, ge=0, lt=1)  # first-moment decay
    beta2: float = _f(0.999, ge=0, lt=1)  # second-moment decay
    eps: float = _f(1e-8, gt=0)  # denominator epsilon
    weight_decay: float = _f(1e-4, ge=0)  # decoupled decay, weight matrices only
    max_grad_norm: float = _f(1.0, gt=0)  # clip threshold of the gradient norm
    # 'global': one norm over every gradient clips all of them; 'group': each optimizer group
    # (encoder, q, pi, v, bce, aux) is clipped by its own norm
    clip_scope: str = _f("group", choices=("global", "group"))


@dataclass(frozen=True, slots=True)
class ReplayConfig(_Section):
    """Replay buffer feeding the Q head."""

    capacity: int = _f(100_000, ge=1)  # max stored transitions
    batch_size: int = _f(256, ge=1)  # transitions per Q update
    min_size: int = _f(1_000, ge=1)  # stored transitions before the Q head trains, <= capacity


@dataclass(frozen=True, slots=True)
class CheckpointConfig(_Section):
    """Checkpoint location and retention."""

    # directory for checkpoint files; empty: the command's own (`trident train`: the run
    # folder's checkpoints/, `trident serve`: SERVE_CHECKPOINT_DIR, runs/serve-<port>/...)
    dir: str = ""
    keep_last: int = _f(5, ge=1)  # newest checkpoints kept on disk
    every_steps: int = _f(0, ge=0)  # training steps between checkpoints; 0 disables
    # a training server's seconds between periodic checkpoints (saved after the Step that ends
    # the period), so a killed server loses at most this much training; 0 disables
    every_s: float = _f(300.0, ge=0)
    # a training server restores the newest committed checkpoint of its dir at start, if there
    # is one (`trident serve --resume`; the container image sets it): a restarted server
    # carries on. An explicit --restore NAME wins. Checkpoints that do not validate are passed
    # over with a warning naming each; where none validates the server stops (exit 2)
    resume: bool = False
    # with resume, where checkpoints exist but none validates: start fresh beside them (a
    # warning names each) instead of stopping; their line is then left behind
    fresh_if_invalid: bool = False


@dataclass(frozen=True, slots=True)
class ServerConfig(_Section):
    """gRPC server, batching and security."""

    host: str = "127.0.0.1"  # gRPC bind address
    port: int = _f(50051, ge=0, le=65535)  # gRPC TCP port
    # also listen on this Unix-domain socket path (empty: not); clients on the same host reach
    # it as `unix:PATH`, past the TCP stack. Same TLS and tokens as the TCP port
    unix_socket: str = ""
    metrics_port: int = _f(9464, ge=0, le=65535)  # metrics HTTP TCP port
    max_message_mb: int = _f(64, ge=1)  # max gRPC message size (MiB)
    # Steps' worth of rollouts queued behind the one training before backpressure (a request's
    # own Step counts as a whole one): a full queue answers a Step request RESOURCE_EXHAUSTED
    # and makes an Interact stream wait; each one more lets a rollout wait a Step longer
    step_queue_size: int = _f(1, ge=1)
    # the longest a rollout waits for others to fill the learner's Step (ms): a Step starts
    # when its columns are in, when every open stream waits, or this long after its oldest
    # rollout arrived, with the whole rollouts that have
    step_max_wait_ms: float = _f(10_000.0, ge=0)
    # ranks of this server on this host (NumPy: processes over shared memory), each holding
    # train.data_shards / world_size of every Step; rank 0 answers gRPC
    world_size: int = _f(1, ge=1)
    # Idempotency keys of applied Steps remembered, with their answers (saved in checkpoints):
    # a Step re-sent with a key this old or newer is answered, never applied twice.
    step_key_window: int = _f(4096, ge=1)
    # max observations per batched Act forward: concurrent actors' requests are merged up to
    # this (a size that fills a GPU; a larger request runs alone)
    act_max_batch: int = _f(65536, ge=1)
    # extra wait to fill an Act batch (ms); 0 batches what queued during the previous forward
    act_max_wait_ms: float = _f(0.0, ge=0)
    # how long a thread keeps the GIL while another waits for it (ms; Python's own is 5): the
    # gRPC handlers, the act batcher and the Step worker take turns sooner
    gil_switch_interval_ms: float = _f(0.5, gt=0, le=1000)
    # client authentication to enforce, checked at start-up: 'auto' (what auth_token and
    # tls_client_ca turn on) or exactly 'none', 'token', 'mtls' or 'token+mtls' (TLS: tls_cert)
    auth_mode: str = _f("auto", choices=("auto", "none", "token", "mtls", "token+mtls"))
    auth_token: str = ""  # one bearer token (role admin) required from clients; empty: none
    # role tokens: a file of '<role> sha256:<hex>' lines (actor, viewer, admin; `trident token`)
    auth_tokens_file: str = ""
    tls_cert: str = ""  # server certificate PEM path; empty disables TLS
    tls_key: str = ""  # server private key PEM path
    tls_client_ca: str = ""  # CA PEM path for client certs (mTLS); empty disables mTLS
    # Admission (service/server/admission.py): each kind of call has its own bound, so data
    # traffic never crowds out health checks or an operator's calls; a call past its bound is
    # answered RESOURCE_EXHAUSTED naming the setting. The handler pool has a thread for each
    # bound's calls plus 4 for health checks (unbounded: they return at once).

    # Step and Act calls in flight
    max_concurrent_rpcs: int = _f(64, ge=2)
    # Interact and StreamStep streams open (each holds a handler thread for its life)
    max_streams: int = _f(64, ge=1)
    # control calls in flight: GetStatus, Checkpoint, ListCheckpoints, Restore,
    # UpdateHyperparams, health Watch streams and reflection streams
    max_control_rpcs: int = _f(16, ge=1)
    # a stream waiting this long on its client (for its next request, or for it to read a
    # reply) is ended (s): an actor sends every env step, so 30 s of silence is a client gone
    # quiet or never reading, whose thread and seat at the Step queue go back
    stream_idle_s: float = _f(30.0, gt=0)
    # a unary call's one request must arrive whole this long after the call began (s), else
    # the call is ended: gRPC holds a handler thread while it collects a request, so a client
    # trickling one would hold it; 64 MiB (server.max_message_mb) takes 5 s at 100 Mbit/s
    request_receive_s: float = _f(30.0, gt=0)
    # HTTP/2 keepalive: the server pings each connection this often (s), and closes it when a
    # ping is unanswered for keepalive_timeout_s, ending its calls: a peer that vanished
    # without closing (a half-open TCP connection) is dropped within their sum (30 s)
    keepalive_s: float = _f(20.0, gt=0)
    # how long a keepalive ping may go unanswered before the connection is closed (s)
    keepalive_timeout_s: float = _f(10.0, gt=0)
    # a connection with no call for this long is closed (GOAWAY; a client reconnects on its
    # next call transparently) (s)
    connection_idle_s: float = _f(300.0, gt=0)
    # the largest rollout an Interact stream may declare (MiB: envs x rollout_len x the
    # rollout's per-step bytes), checked before anything is allocated; the default is
    # max_message_mb's, the size of the unary Step an actor re-sends it as when a stream breaks
    max_rollout_mb: int = _f(64, ge=1)
    # Front-end processes hand Acts and rollouts to the learner process in shared memory
    # (service/handoff): each front end maps this many Act slots, each of handoff_act_rows
    # observations; an Act past a free slot waits for one
    handoff_act_slots: int = _f(32, ge=1, le=4096)
    # the most observations one Act request carries to the learner (rows of an Act slot); a
    # larger one is refused RESOURCE_EXHAUSTED naming this setting
    handoff_act_rows: int = _f(16384, ge=1)
    # rollouts one front-end process has in the learner's hands at once, each in a slot of
    # server.max_rollout_mb (final observations included); another waits for a free slot
    handoff_rollout_slots: int = _f(8, ge=1, le=4096)
    # the shared memory all front-end processes together may map (MiB: their Act and rollout
    # slots), checked before a front end's slots are made
    handoff_max_mb: int = _f(8192, ge=1)
    # gRPC front-end processes in front of the learner process, all on the one public port
    # (the kernel spreads connections over them): each terminates gRPC, authenticates,
    # validates and assembles its streams' rollouts, handing Acts and rollouts to the learner in
    # shared memory; one that dies is replaced. 0: gRPC in the learner's own process; -1: per
    # machine, three in four cores on a host of 8 cores or more (no more than handoff_max_mb
    # holds the slots of), else 0 (docs/benchmarks/served.md has the measurements this comes
    # from)
    front_ends: int = _f(-1, ge=-1, le=64)
    shutdown_grace_s: float = _f(30.0, ge=0)  # SIGTERM: seconds in-flight RPCs get to finish
    log_level: str = _f("INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))  # log threshold

    def client_auth(self) -> str:
        """auth_mode with 'auto' resolved: what auth_token and tls_client_ca turn on."""
        if self.auth_mode != "auto":
            return self.auth_mode
        tokens = self.auth_token or self.auth_tokens_file
        on = [mode for mode, setting in (("token", tokens), ("mtls", self.tls_client_ca))
              if setting]  # fmt: skip
        return "+".join(on) or "none"


@dataclass(frozen=True, slots=True)
class LobsimConfig(_Section):
    """LobSim markets (service/lobsim): book, background flow, agent, reward."""

    price_levels: int = _f(64, ge=24)  # ticks in each book's price window
    visible_levels: int = _f(10, ge=1)  # levels per side in the observation
    events_per_step: int = _f(13, ge=1)  # background events between two agent decisions
    horizon: int = _f(400, ge=2)  # agent steps per episode; ends with liquidation
    max_inventory: int = _f(20, ge=1)  # |inventory| at which market orders are masked
    quote_size: int = _f(1, ge=1)  # lots per agent quote
    market_size: int = _f(1, ge=1)  # lots per agent market order (actions 7, 8)
    latency_events: int = _f(2, ge=0)  # background events before the agent's messages land
    random_latency: bool = False  # latency uniform in [0, latency_events] instead of fixed
    limit_weight: int = _f(100, ge=1)  # background limit-order weight at the touch
    limit_decay_pct: int = _f(70, ge=1, le=100)  # weight kept per extra tick from the touch
    cancel_weight: int = _f(3, ge=0)  # background cancel weight per resting lot
    market_weight: int = _f(30, ge=0)  # background market-order weight
    hawkes: bool = False  # self-exciting market orders (clustered flow)
    hawkes_jump: int = _f(40, ge=0)  # market weight added by each market order (hawkes)
    hawkes_decay_pct: int = _f(85, ge=0, lt=100)  # excitation kept per background event
    max_order_lots: int = _f(4, ge=1)  # background order sizes are uniform in 1..this
    # % of background market orders that are informed: they take the side of the market's
    # hidden direction (a buy when it is up), so signed flow predicts the next mid move (0: off)
    informed_pct: int = _f(0, ge=0, le=100)
    # ‰ chance per agent step that a market's hidden direction flips (informed flow)
    informed_flip_permille: int = _f(20, ge=0, le=1000)
    randomize_pct: int = _f(30, ge=0, le=90)  # per-env flow weights scaled by 1 ± this %
    initial_depth: int = _f(8, ge=1)  # levels per side filled at reset
    # the window re-centres on the mid once it has drifted more than this many ticks (0: never)
    recentre_ticks: int = _f(16, ge=0)
    taker_fee: float = _f(0.1, ge=0)  # ticks per lot the agent pays when it takes
    maker_rebate: float = _f(0.05, ge=0)  # ticks per lot the agent earns when it is filled
    damping: float = _f(0.5, ge=0)  # eta: penalty on max(0, inventory x mid change)
    inventory_penalty: float = _f(0.01, ge=0)  # phi: penalty on inventory squared per step

    def __post_init__(self) -> None:
        _Section.__post_init__(self)
        half = self.price_levels // 2
        for key in ("initial_depth", "visible_levels", "recentre_ticks"):
            value = getattr(self, key)
            if value >= half:
                raise ConfigError(f"lobsim.{key} = {value!r} must be < lobsim.price_levels // 2 "
                                  f"= {half} (it must fit on one side of the window's centre)")
        if self.latency_events > self.events_per_step:
            raise ConfigError(f"lobsim.latency_events = {self.latency_events!r} must be <= "
                              f"lobsim.events_per_step = {self.events_per_step!r} (the agent's "
                              f"messages land within the step)")


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration: one frozen dataclass per section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    kickstart: KickstartConfig = field(default_factory=KickstartConfig)
    c51: C51Config = field(default_factory=C51Config)
    optim: OptimConfig = field(default_factory=OptimConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    lobsim: LobsimConfig = field(default_factory=LobsimConfig)

    def __post_init__(self) -> None:
        for f in fields(self):
            if not isinstance(getattr(self, f.name), f.default_factory):
                raise ConfigError(f"section {f.name!r} must be a {f.default_factory.__name__}")
        c51, replay = self.c51, self.replay
        if not c51.v_min < c51.v_max:
            raise ConfigError(f"c51.v_min = {c51.v_min!r} must be < c51.v_max = {c51.v_max!r}")
        if replay.min_size > replay.capacity:
            raise ConfigError(f"replay.min_size = {replay.min_size!r} must be <= "
                              f"replay.capacity = {replay.capacity!r}")
        shards, world = self.train.data_shards, self.server.world_size
        if shards % world:
            raise ConfigError(f"train.data_shards = {shards!r} must be a multiple of "
                              f"server.world_size = {world!r} (--world-size, --gpus): each rank "
                              "holds an equal share of every Step")  # fmt: skip
        for key, value in (("replay.capacity", replay.capacity),
                           ("replay.batch_size", replay.batch_size)):  # fmt: skip
            if value % shards:
                raise ConfigError(f"{key} = {value!r} must be a multiple of train.data_shards "
                                  f"= {shards!r} (each shard holds an equal part)")  # fmt: skip
        server = self.server
        if server.step_queue_size >= server.max_concurrent_rpcs:
            raise ConfigError(f"server.step_queue_size = {server.step_queue_size!r} must be < "
                              f"server.max_concurrent_rpcs = {server.max_concurrent_rpcs!r}")
        if bool(server.tls_cert) != bool(server.tls_key):
            raise ConfigError("server.tls_cert and server.tls_key: expected both set or both "
                              f"empty, got tls_cert={server.tls_cert!r}, "
                              f"tls_key={server.tls_key!r}")
        if server.tls_client_ca and not server.tls_cert:
            raise ConfigError("server.tls_client_ca (mTLS) requires server.tls_cert and "
                              "server.tls_key")
        _check_auth_mode(server)
        _check_kickstart(self.kickstart, self.model)
        if self.model.dtype == "float64" and self.train.backend != "numpy":
            raise ConfigError(f"model.dtype = 'float64' requires train.backend = 'numpy' "
                              f"(float64 is for the numpy backend only); got train.backend = "
                              f"{self.train.backend!r}")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Nested plain dict ``{section: {key: value}}``, JSON-serialisable."""
        return asdict(self)

    def public_dict(self) -> dict[str, dict[str, Any]]:
        """`to_dict()` without server.auth_token and server.auth_mode (`from_dict` reads them
        back as their defaults: no token, 'auto'), for what leaves the process: checkpoints'
        config.json and the service's config replies. Left out rather than blanked, since a
        blank token reads as "no token"; GetStatus states the auth mode instead. A restore keeps
        the running server's own server section, so nothing is lost."""
        public = self.to_dict()
        for key in ("auth_token", "auth_mode"):
            del public["server"][key]
        return public

    def to_toml(self) -> str:
        """`public_dict()` as a TOML document that `load_config` reads back to this config."""
        lines = []
        for section, table in self.public_dict().items():
            lines += ["", f"[{section}]"] if lines else [f"[{section}]"]
            lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Config":
        """Validated config from a nested dict (e.g. a checkpoint's); missing keys default."""
        raw: dict[str, dict[str, Any]] = {}
        _merge_tables(raw, d, source=None)
        return _build(raw)


def _toml_value(value: str | int | float | bool) -> str:
    """One setting as TOML: a JSON string is a TOML basic string; floats keep their repr (the
    config holds finite ones only); bool before int, since bool is an int."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def with_checkpoint_dir(cfg: Config, default: str | os.PathLike[str]) -> Config:
    """`cfg` with checkpoint.dir set to the command's `default` where it is left empty."""
    return cfg if cfg.checkpoint.dir else with_overrides(cfg, [f"checkpoint.dir={default}"])


def _check_kickstart(kick: KickstartConfig, model: ModelConfig) -> None:
    """A kickstart that is on decays over some Steps, reads a column of the observation and
    names actions of the model (-1: no teacher there); feature -1 is left to the LobSim job,
    which fills in its inventory column (a trainer refuses it, `State`)."""
    if not kick.coef:
        return
    if kick.decay_steps < 1:
        raise ConfigError(f"kickstart.decay_steps = {kick.decay_steps!r} must be >= 1 where "
                          f"kickstart.coef = {kick.coef!r} > 0 (the Steps over which the "
                          "teacher's weight falls to 0)")  # fmt: skip
    if kick.feature >= model.obs_dim:
        raise ConfigError(f"kickstart.feature = {kick.feature!r} must be < model.obs_dim = "
                          f"{model.obs_dim!r} (a column of the observation)")  # fmt: skip
    for key in ("action_below", "action_zero", "action_above"):
        action = getattr(kick, key)
        if action >= model.num_actions:
            raise ConfigError(f"kickstart.{key} = {action!r} must be < model.num_actions = "
                              f"{model.num_actions!r}")  # fmt: skip


def kickstart_weight(kick: KickstartConfig, global_step: int) -> float:
    """The kickstart loss's weight on the Step after `global_step` applied ones:
    coef · max(0, 1 - global_step / decay_steps) (0 where off)."""
    if not kick.coef:
        return 0.0
    return kick.coef * max(0.0, 1.0 - global_step / kick.decay_steps)


def _check_auth_mode(server: ServerConfig) -> None:
    """An explicit server.auth_mode needs its mechanisms' settings, and no other's."""
    if server.auth_mode == "auto":
        return
    wanted = server.auth_mode.split("+")
    for mechanism, keys, what in (
        ("token", ("auth_token", "auth_tokens_file"), "a bearer token, or a file of role tokens"),
        ("mtls", ("tls_client_ca",), "the CA PEM of client certificates"),
    ):
        named = " or ".join(f"server.{key}" for key in keys)
        if mechanism in wanted and not any(getattr(server, key) for key in keys):
            raise ConfigError(f"server.auth_mode = {server.auth_mode!r} requires {named} "
                              f"({what}); got none")  # fmt: skip
        for key in keys:
            if mechanism not in wanted and getattr(server, key):
                raise ConfigError(f"server.auth_mode = {server.auth_mode!r} does not use "
                                  f"server.{key}; expected it empty, or an auth_mode with "
                                  f"{mechanism!r}")  # fmt: skip


_SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(Config)}
_SECTION_NAMES = {cls: name for name, cls in _SECTIONS.items()}
_FIELDS: dict[str, dict[str, Field]] = {
    name: {f.name: f for f in fields(cls)} for name, cls in _SECTIONS.items()
}


def _section_fields(section: str) -> dict[str, Field]:
    """The fields of ``section``, or ConfigError listing the valid sections."""
    if section not in _FIELDS:
        raise ConfigError(
            f"unknown config section {section!r}{_did_you_mean(section, _FIELDS)}; "
            f"valid sections: {', '.join(_FIELDS)}"
        )
    return _FIELDS[section]


def _lookup(section: str, key: str) -> Field:
    """The field for ``section.key``, or ConfigError listing what is valid."""
    known = _section_fields(section)
    if key not in known:
        raise ConfigError(
            f"unknown config key '{section}.{key}'{_closest_key(section, key)}; "
            f"valid keys of [{section}]: {', '.join(known)}"
        )
    return known[key]


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    """The hint " (did you mean 'x'?)" for the known name closest to a misspelt `name`, else
    ""."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _closest_key(section: str, key: str) -> str:
    """The hint " (did you mean 'section.key'?)": the closest key of `section`, else `key`
    where another section has it (``train.lr`` -> ``optim.lr``), else ""."""
    close = difflib.get_close_matches(key, list(_FIELDS[section]), n=1, cutoff=0.6)
    if close:
        return f" (did you mean '{section}.{close[0]}'?)"
    elsewhere = [name for name, keys in _FIELDS.items() if key in keys]
    return f" (did you mean '{elsewhere[0]}.{key}'?)" if elsewhere else ""


def _check_value(key: str, f: Field, value: Any) -> Any:
    """Strict type check (bool is not int; int widens to float), then the field's rule."""
    typ = f.type
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or (typ is not bool and isinstance(value, bool)):
        raise ConfigError(f"{key} = {value!r} has type {type(value).__name__}; "
                          f"expected {typ.__name__}")
    if typ is float and not math.isfinite(value):
        raise ConfigError(f"{key} = {value!r} is not finite; expected a finite number")
    rule: _Rule | None = f.metadata.get("rule")
    if rule is not None and not rule.allows(value):
        what = "not a valid choice" if rule.choices else "out of range"
        raise ConfigError(f"{key} = {value!r} is {what}; must be {rule.describe()}")
    return value


def _parse_text(key: str, typ: type, text: str) -> Any:
    """Parse an env/--set string according to the field's declared type."""
    try:
        return _BOOL_WORDS[text.strip().lower()] if typ is bool else typ(text)
    except (KeyError, ValueError):
        words = "; expected one of " + "/".join(_BOOL_WORDS) if typ is bool else ""
        raise ConfigError(f"{key} = {text!r} is not a valid {typ.__name__}{words}") from None


@contextmanager
def _origin(source: str | None) -> Iterator[None]:
    """Append where a bad value came from to any ConfigError raised inside."""
    try:
        yield
    except ConfigError as e:
        raise ConfigError(f"{e} (from {source})" if source else str(e)) from None


def _put(raw: dict[str, dict[str, Any]], section: str, key: str, value: Any, *,
         text: bool) -> None:
    """Validate one value (parsing it first if it is text) and store it in ``raw``."""
    f = _lookup(section, key)
    if text:
        value = _parse_text(f"{section}.{key}", f.type, value)
    raw.setdefault(section, {})[key] = _check_value(f"{section}.{key}", f, value)


def _merge_tables(raw: dict[str, dict[str, Any]], data: Mapping[str, Any],
                  source: str | None) -> None:
    """Merge typed values from ``{section: {key: value}}`` (TOML document or dict)."""
    with _origin(source):
        if not isinstance(data, Mapping):
            raise ConfigError(f"config must be a table of sections, got {data!r}")
        for section, table in data.items():
            _section_fields(section)
            if not isinstance(table, Mapping):
                raise ConfigError(f"[{section}] must be a table of keys, got {table!r}")
            for key, value in table.items():
                _put(raw, section, key, value, text=False)


def _merge_env(raw: dict[str, dict[str, Any]], env: Mapping[str, str]) -> None:
    """Merge ``TRIDENT_<SECTION>__<KEY>`` variables; other TRIDENT_ variables are ignored."""
    for name in sorted(env):
        rest = name[len(ENV_PREFIX):]
        if name.startswith(ENV_PREFIX) and "__" not in rest:
            _check_one_underscore(name)
        if name.startswith(ENV_PREFIX) and "__" in rest:
            section, _, key = rest.partition("__")
            with _origin(f"environment variable {name}"):
                _put(raw, section.lower(), key.lower(), env[name], text=True)


def _check_one_underscore(name: str) -> None:
    """ConfigError for ``TRIDENT_<SECTION>_<KEY>`` (one underscore) where KEY is, or nearly
    is, a key of SECTION: a setting meant, that would otherwise be ignored. Other TRIDENT_
    variables (TRIDENT_TOKEN, TRIDENT_RANK, a test's own) pass."""
    section, _, key = name.removeprefix(ENV_PREFIX).lower().partition("_")
    close = difflib.get_close_matches(key, list(_FIELDS.get(section, ())), n=1, cutoff=0.8)
    if close:
        meant = f"{ENV_PREFIX}{section.upper()}__{close[0].upper()}"
        raise ConfigError(f"environment variable {name}: settings are read from "
                          f"TRIDENT_<SECTION>__<KEY>, two underscores between section and key "
                          f"(did you mean {meant}?)")  # fmt: skip


def _merge_overrides(raw: dict[str, dict[str, Any]], overrides: Sequence[str]) -> None:
    """Merge ``section.key=value`` flags (``--set``) in order; later ones win."""
    for item in [overrides] if isinstance(overrides, str) else overrides:
        lhs, eq, value = item.partition("=")
        section, dot, key = lhs.strip().partition(".")
        if not (eq and dot and section and key):
            raise ConfigError(f"malformed --set {item!r}: expected section.key=value")
        with _origin(f"--set {item}"):
            _put(raw, section, key, value, text=True)


def _merge_flags(raw: dict[str, dict[str, Any]], flags: Mapping[str, tuple[str, str]]) -> None:
    """Merge command-line options that stand for one setting each, ``{"--port": ("server.port",
    "70000")}``. An error names the option alone: its value may be a secret read from a file."""
    for flag, (setting, value) in flags.items():
        section, _, key = setting.partition(".")
        with _origin(flag):
            _put(raw, section, key, value, text=True)


def _read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a TOML file, turning I/O and syntax errors into ConfigError naming the file."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {os.fspath(path)}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {os.fspath(path)}: {e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"invalid TOML in config file {os.fspath(path)}: {e}") from None


def _build(raw: Mapping[str, Mapping[str, Any]]) -> Config:
    """Construct (and thereby fully validate) a Config from checked per-section values."""
    return Config(**{name: cls(**raw.get(name, {})) for name, cls in _SECTIONS.items()})


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
                overrides: Sequence[str] = (),
                flags: Mapping[str, tuple[str, str]] | None = None,
                base: Sequence[str] = ()) -> Config:
    """Defaults < ``base`` (a job's own ``section.key=value`` settings) < TOML file at ``path``
    < ``env`` (default os.environ) < ``overrides`` (``--set``) < ``flags``: options that stand
    for one setting, ``{"--port": ("server.port", "70000")}``."""
    raw: dict[str, dict[str, Any]] = {}
    _merge_overrides(raw, base)
    if path is not None:
        _merge_tables(raw, _read_toml(path), source=f"config file {os.fspath(path)}")
    _merge_env(raw, os.environ if env is None else env)
    _merge_overrides(raw, overrides)
    _merge_flags(raw, flags or {})
    return _build(raw)


def with_overrides(cfg: Config, overrides: Sequence[str]) -> Config:
    """A copy of ``cfg`` with ``section.key=value`` overrides applied and re-validated."""
    raw = cfg.to_dict()
    _merge_overrides(raw, overrides)
    return _build(raw)
