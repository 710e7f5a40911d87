"""One server, several ranks: `trident serve --world-size W` (this host's cores, NumPy),
`--gpus W` (this host's GPUs, NCCL), or TRIDENT_RANK & co. (several hosts).

Rank 0 is the server process: it answers gRPC and metrics, and its `RankedTrainer` stands in
for the Trainer. Ranks 1 .. W-1 are processes it starts (`start_ranks`); each holds a Trainer
of the same config with its share of train.data_shards and runs what rank 0 sends down its
pipe, in order: a Step (the whole rollout; each rank takes its columns), the replay gather of
a checkpoint, a restore, new hyper-parameters, stop. The ranks meet in the collectives of
those calls (service/backend/comm.py), which every call makes on every rank in the same
order, so rank 0 sends before it runs its own part. Act needs no other rank: every rank holds
the same parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import multiprocessing
import signal
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

import numpy as np
from threadpoolctl import threadpool_limits

from service import logs
from service.backend import require_cuda, resolve_name
from service.backend.blas import single_blas_thread
from service.backend.comm import Communicator, SharedMemoryGroup
from service.backend.rendezvous import Topology
from service.backend.tcp_comm import TcpRank
from service.config import Config, ConfigError
from service.errors import InvalidInput
from service.trainer.rollout import validate_rollout
from service.trainer.trainer import Trainer
from service.types import Rollout, StepResult

SPAWN = multiprocessing.get_context("spawn")
COLLECTIVE_DEADLINE_S = 120.0
STOP_TIMEOUT_S = 30.0


def slot_bytes(trainer: Trainer) -> int:
    """The largest buffer a collective carries (float64): every parameter with the losses and
    statistics, or one field of every replay ring a rank holds."""
    state = trainer.state
    params = sum(int(np.prod(v.shape)) for v in state.params.values())
    rings = state.replay.capacity * state.replay.shards * max(state.config.model.obs_dim, 1)
    return 8 * (max(params, rings) + 64)


class Ranks(Protocol):
    """The other ranks, as rank 0 reaches them."""

    def send(self, *command: Any) -> None: ...

    def stop(self) -> None: ...


class Group(Protocol):
    """What the ranks of one host share: SharedMemoryGroup (NumPy) or NcclGroup (GPUs)."""

    def communicator(self, rank: int, deadline_s: float) -> Communicator: ...

    def close(self) -> None: ...


@dataclass
class LocalRanks:
    """The other ranks on this host: their processes, the pipes to them and the shared group."""

    group: Group
    pipes: list[Connection]
    processes: list[BaseProcess]

    def send(self, *command: Any) -> None:
        for pipe in self.pipes:
            pipe.send(command)

    def stop(self) -> None:
        """Stop every rank (it finishes the command it is in), then free the group."""
        for pipe in self.pipes:
            with contextlib.suppress(BrokenPipeError, OSError):
                pipe.send(("stop",))
        for process in self.processes:
            process.join(STOP_TIMEOUT_S)
            if process.exitcode is None:
                process.kill()
        self.group.close()


def start_ranks(config: Config, topology: Topology | None = None) -> tuple[Trainer, Ranks | None]:
    """Rank 0's trainer, and the other ranks: on other hosts (`topology`: they connect to it
    here), or started here for server.world_size ranks."""
    if topology is not None and topology.world_size > 1:
        return join_hosts(config, topology)
    world = config.server.world_size
    if world == 1:
        return Trainer(config), None
    group: Group
    if resolve_name(config.train.backend) == "cuda":  # one GPU per rank, sums over NCCL
        require_cuda()
        from service.backend.cuda.nccl import NcclGroup  # CuPy loads only here

        group = NcclGroup.create(world)
    else:
        threadpool_limits(limits=1, user_api="blas")  # the ranks share the cores
        probe = Trainer(config)  # the sizes of the buffers the collectives carry
        group = SharedMemoryGroup.create(SPAWN, world, slot_bytes(probe))
        del probe
    pipes, processes = [], []
    for rank in range(1, world):
        receiver, sender = SPAWN.Pipe(duplex=False)
        process = SPAWN.Process(target=serve_rank, args=(group, rank, config, receiver),
                                name=f"trident-rank-{rank}", daemon=True)  # fmt: skip
        process.start()
        pipes.append(sender)
        processes.append(process)
    ranks = LocalRanks(group, pipes, processes)
    try:
        trainer = Trainer(config, comm=group.communicator(0, COLLECTIVE_DEADLINE_S))
    except BaseException:
        ranks.stop()
        raise
    logs.event(logging.INFO, "ranks", world_size=world, data_shards=config.train.data_shards)
    return trainer, ranks


def join_hosts(config: Config, topology: Topology) -> tuple[Trainer, Ranks]:
    """Rank 0 of ranks on several hosts: wait for the others to connect, then train with them
    (NumPy: the sums go over the same links)."""
    check_world(config, topology.world_size)
    link = TcpRank(topology, COLLECTIVE_DEADLINE_S)
    if config.train.backend != "cuda":
        threadpool_limits(limits=1, user_api="blas")
    logs.event(logging.INFO, "ranks", world_size=topology.world_size,
               data_shards=config.train.data_shards, hosts=True)  # fmt: skip
    return Trainer(config, comm=link), RemoteRanks(link)


def serve_host_rank(config: Config, topology: Topology) -> int:
    """`trident serve` as rank r > 0 of several hosts: connect to rank 0, run its commands."""
    check_world(config, topology.world_size)
    # A SIGTERM (a pod deleted with its StatefulSet) waits for rank 0's stop: rank 0 is being
    # stopped too, and its final checkpoint gathers this rank's replay first.
    signal.signal(signal.SIGTERM, lambda *_: logs.event(
        logging.INFO, "SIGTERM: finishing rank 0's commands until it says stop"))  # fmt: skip
    link = TcpRank(topology, COLLECTIVE_DEADLINE_S)
    trainer = Trainer(config, comm=link)
    logs.event(logging.INFO, "rank joined", rank=topology.rank, world_size=topology.world_size)
    with single_blas_thread(trainer.backend.name):
        run_commands(trainer, RemoteCommands(link))
    link.close()
    logs.event(logging.INFO, "rank stopped", rank=topology.rank)
    return 0


def check_world(config: Config, world: int) -> None:
    if config.train.data_shards % world:
        raise ConfigError(
            f"train.data_shards = {config.train.data_shards} must be a multiple of "
            f"TRIDENT_WORLD_SIZE = {world}: each rank holds an equal share"
        )


class RemoteRanks:
    """The ranks on other hosts, over rank 0's TCP links."""

    def __init__(self, link: TcpRank) -> None:
        self.link = link

    def send(self, *command: Any) -> None:
        payload = encode_command(*command)
        for rank in range(1, self.link.world_size):
            self.link.send(payload, rank)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.send("stop")
        self.link.close()


class RemoteCommands:
    """Rank 0's commands as a rank on another host receives them."""

    def __init__(self, link: TcpRank) -> None:
        self.link = link

    def recv(self) -> tuple:
        return decode_command(self.link.receive(0, "a command", wait=True))


def encode_command(name: str, payload: Any = None) -> bytes:
    """A command as bytes a rank decodes without pickle: a JSON header, then the arrays."""
    arrays: dict[str, np.ndarray] = {}
    values: dict[str, Any] = {}
    if isinstance(payload, Rollout):
        fields = {f.name: getattr(payload, f.name) for f in dataclasses.fields(Rollout)}
        arrays = {k: v for k, v in fields.items() if isinstance(v, np.ndarray)}
        values = {"policy_version": payload.policy_version, "kind": "rollout"}
    elif isinstance(payload, Mapping) and all(isinstance(v, np.ndarray) for v in payload.values()):
        arrays, values = dict(payload), {"kind": "arrays"}
    elif payload is not None:
        values = {"kind": "values", "values": dict(payload)}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    header = json.dumps({"command": name, **values}).encode()
    return struct.pack("!I", len(header)) + header + buffer.getvalue()


def decode_command(data: bytes) -> tuple:
    (size,) = struct.unpack("!I", data[:4])
    header = json.loads(data[4 : 4 + size])
    arrays = dict(np.load(io.BytesIO(data[4 + size :]), allow_pickle=False))
    kind = header.get("kind")
    if kind == "rollout":
        return header["command"], Rollout(**arrays, policy_version=header["policy_version"])
    if kind == "arrays":
        return header["command"], arrays
    if kind == "values":
        return header["command"], header["values"]
    return (header["command"],)


def serve_rank(group: Group, rank: int, config: Config, commands: Connection) -> None:
    """A rank other than 0: run rank 0's commands until it says stop (or goes away)."""
    comm = group.communicator(rank, COLLECTIVE_DEADLINE_S)
    trainer = Trainer(config, comm=comm)
    with single_blas_thread(trainer.backend.name):  # one core per rank, no BLAS pool each
        run_commands(trainer, commands)


def run_commands(trainer: Trainer, commands: Connection | RemoteCommands) -> None:
    while True:
        try:
            command, *args = commands.recv()
        except EOFError:  # rank 0 is gone
            return
        if command == "stop":
            return
        if command == "step":
            trainer.step(own_columns(args[0], trainer))
        elif command == "state_dict":
            trainer.state_dict()  # this rank's part of the replay gather
        elif command == "load":
            trainer.load_state_dict(args[0])
        elif command == "hyper":
            trainer.update_hyperparams(args[0])


def own_columns(rollout: Rollout, trainer: Trainer) -> Rollout:
    """The columns of `rollout` that the shards `trainer` holds cover."""
    sharding = trainer.state.sharding
    if rollout.num_envs % sharding.shards:
        raise InvalidInput("rollout columns", f"a multiple of train.data_shards = "
                           f"{sharding.shards}", str(rollout.num_envs))  # fmt: skip
    block = rollout.num_envs // sharding.shards
    return rollout.columns(sharding.owned.start * block, sharding.owned.stop * block)


class RankedTrainer:
    """Rank 0's trainer: what changes the state goes to every rank, then runs here; the rest
    (Act, status, the digest) is this rank's Trainer's own."""

    def __init__(self, trainer: Trainer, ranks: Ranks) -> None:
        self.trainer, self.ranks = trainer, ranks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.trainer, name)

    def step(self, rollout: Rollout, finite: bool = False) -> StepResult:
        validate_rollout(rollout, self.trainer.config)  # refused here, it reaches no rank
        mine = own_columns(rollout, self.trainer)
        self.ranks.send("step", rollout)  # each rank checks its own columns' floats
        return self.trainer.step(mine, finite)

    def state_dict(self) -> dict[str, np.ndarray]:
        self.ranks.send("state_dict")
        return self.trainer.state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.trainer.load_state_dict(state)  # checked whole here first
        self.ranks.send("load", dict(state))

    def update_hyperparams(self, updates: Mapping[str, float]) -> None:
        self.trainer.update_hyperparams(updates)
        self.ranks.send("hyper", dict(updates))
