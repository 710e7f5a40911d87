"""How the ranks of a data-parallel trainer find each other, on one host or several.

Each process knows its place from flags or the environment: `TRIDENT_RANK`,
`TRIDENT_WORLD_SIZE` and `TRIDENT_RENDEZVOUS` (HOST:PORT of rank 0). Rank 0 listens there and
hands every other rank the bytes they all need to start (NCCL's unique id); each rank says
who it is and what world it expects, so a rank of another job, a repeated rank or a wrong
world size is refused by name. Everything has a deadline: a rank that never comes makes rank 0
fail naming it, and a rank 0 that never listens makes the others fail naming the address.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass

from service.errors import InvalidInput, TridentError

MAGIC = b"TRDT1"
HELLO = struct.Struct("!5sII")  # magic, rank, world size
ANSWER = struct.Struct("!BI")  # refused (0 or 1), length of the reason that follows
FRAME = struct.Struct("!Q")  # length of the bytes that follow
ENV_RANK, ENV_WORLD, ENV_ADDRESS = "TRIDENT_RANK", "TRIDENT_WORLD_SIZE", "TRIDENT_RENDEZVOUS"


class RendezvousError(TridentError):
    """The ranks could not meet: a deadline passed, or a rank did not belong."""


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    host: str
    port: int

    @classmethod
    def of(cls, rank: object, world_size: object, address: object) -> Topology:
        """A checked topology; InvalidInput names the field that is wrong."""
        if type(world_size) is not int or world_size < 1:
            raise InvalidInput("world_size", "an integer >= 1", repr(world_size))
        if type(rank) is not int or not 0 <= rank < world_size:
            raise InvalidInput("rank", f"an integer in [0, {world_size})", repr(rank))
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidInput("rendezvous", "HOST:PORT of rank 0, port in [1, 65535]",
                               repr(address))  # fmt: skip
        return cls(rank, world_size, host.strip("[]"), int(port))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Topology:
        """From TRIDENT_RANK, TRIDENT_WORLD_SIZE and TRIDENT_RENDEZVOUS."""
        values: dict[str, object] = {}
        for name, field in ((ENV_RANK, "rank"), (ENV_WORLD, "world_size")):
            raw = env.get(name)
            if raw is None or not raw.strip().lstrip("-").isdigit():
                raise InvalidInput(name, "an integer", repr(raw))
            values[field] = int(raw)
        if ENV_ADDRESS not in env:
            raise InvalidInput(ENV_ADDRESS, "HOST:PORT of rank 0", "nothing")
        return cls.of(values["rank"], values["world_size"], env[ENV_ADDRESS])


def share(topology: Topology, payload: bytes | None, deadline_s: float = 120.0) -> bytes:
    """Rank 0 hands `payload` to every other rank; every rank returns it."""
    deadline = time.monotonic() + deadline_s
    if topology.rank == 0:
        if payload is None:
            raise InvalidInput("payload", "bytes on rank 0", "None")
        links = meet(topology, deadline) if topology.world_size > 1 else {}
        for link in links.values():
            with link:
                link.sendall(FRAME.pack(len(payload)) + payload)
        return payload
    with dial(topology, deadline) as link:
        (size,) = FRAME.unpack(_receive(link, FRAME.size))
        return _receive(link, size)


def meet(topology: Topology, deadline: float) -> dict[int, socket.socket]:
    """Rank 0: a connected socket from every other rank, each checked to be a rank of this
    world not seen yet (answered 0; a stray one 1 and a reason). A rank of another world size
    is an error here too; a missing one, past `deadline` (time.monotonic), names it."""
    links: dict[int, socket.socket] = {}
    waiting = set(range(1, topology.world_size))
    with socket.create_server((topology.host, topology.port)) as listener:
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                for link in links.values():
                    link.close()
                raise RendezvousError(
                    f"rank 0: ranks {sorted(waiting)} of {topology.world_size} did not reach "
                    f"{topology.host}:{topology.port} in time"
                )
            listener.settimeout(left)
            try:
                link, peer = listener.accept()
            except TimeoutError:
                continue
            link.settimeout(max(0.1, deadline - time.monotonic()))
            magic, rank, world = HELLO.unpack(_receive(link, HELLO.size))
            if magic == MAGIC and world == topology.world_size and rank in waiting:
                link.sendall(ANSWER.pack(0, 0))
                links[rank] = link
                waiting.discard(rank)
                continue
            reason = (f"expected a Trident rank in {sorted(waiting)} of world "
                      f"{topology.world_size}, got rank {rank} of world {world}")  # fmt: skip
            with link:
                link.sendall(ANSWER.pack(1, len(reason)) + reason.encode())
            if magic == MAGIC and world != topology.world_size:
                raise RendezvousError(f"rank 0: {peer[0]}: {reason}")
    return links


def dial(topology: Topology, deadline: float) -> socket.socket:
    """A rank past 0: its socket to rank 0, connected (retrying until `deadline`) and
    accepted; RendezvousError naming the address, or rank 0's reason to refuse it."""
    address = (topology.host, topology.port)
    while True:
        try:
            link = socket.create_connection(address, timeout=1.0)
            break
        except OSError as error:
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"rank {topology.rank}: no rank 0 at {topology.host}:{topology.port} "
                    f"({error.strerror or error})"
                ) from None
            time.sleep(0.1)
    link.settimeout(max(0.1, deadline - time.monotonic()))
    link.sendall(HELLO.pack(MAGIC, topology.rank, topology.world_size))
    refused, size = ANSWER.unpack(_receive(link, ANSWER.size))
    if refused:
        reason = _receive(link, size).decode()
        link.close()
        raise RendezvousError(f"rank {topology.rank}: rank 0 refused it: {reason}")
    return link


def _receive(connection: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        try:
            chunk = connection.recv(min(left, 1 << 16))
        except TimeoutError:
            raise RendezvousError("the rendezvous timed out mid-message") from None
        if not chunk:
            raise RendezvousError("the other side closed the rendezvous connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
