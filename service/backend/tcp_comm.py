"""Ranks on several hosts over TCP: the links of a data-parallel server whose ranks do not
share a machine.

Rank 0 listens on the rendezvous address (`Topology`); every other rank connects to it and
says who it is. Each link carries, in order, what rank 0 tells that rank to do (`send`,
`receive`: framed bytes) and the collectives of the calls that follow: a star through rank 0,
which adds the ranks' buffers in rank order and sends the sum back, so every rank gets the same
bytes. Every receive has the collective's deadline: a rank that died or stalled makes the others
raise CollectiveTimeout. For GPUs the sums go through NCCL instead; these links then carry only
the commands.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import numpy as np

from service.backend.comm import DEFAULT_DEADLINE_S, CollectiveTimeout, check_root
from service.backend.rendezvous import FRAME, RendezvousError, Topology, dial, meet
from service.errors import InvalidInput


class TcpRank:
    """This process's links to the other ranks: rank 0 holds one per rank, the others one."""

    def __init__(self, topology: Topology, deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self.rank, self.world_size, self.deadline_s = topology.rank, topology.world_size, deadline_s
        deadline = time.monotonic() + deadline_s
        self._links = meet(topology, deadline) if self.rank == 0 else {0: dial(topology, deadline)}
        for link in self._links.values():
            link.settimeout(deadline_s)
            link.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # ------------------------------------------------------------------------ framed bytes
    def send(self, payload: bytes, to: int = 0) -> None:
        """One framed message to rank `to` (rank 0's links) or to rank 0 (the others')."""
        self._links[to].sendall(FRAME.pack(len(payload)) + payload)

    def receive(self, source: int = 0, what: str = "a message", wait: bool = False) -> bytes:
        """The next message from `source`, within the deadline (`wait`: however long it takes,
        as a rank idling for its next command; EOFError when rank 0 closes the link)."""
        link = self._links[source]
        if wait:
            link.settimeout(None)
            try:
                header = _exactly(link, FRAME.size, what)
            except RendezvousError:
                raise EOFError(f"rank {self.rank}: rank {source} closed the link") from None
            finally:
                link.settimeout(self.deadline_s)
        else:
            header = self._read(link, FRAME.size, what, source)
        (size,) = FRAME.unpack(header)
        return self._read(link, size, what, source)

    def _read(self, link: socket.socket, size: int, what: str, source: int) -> bytes:
        try:
            return _exactly(link, size, what)
        except (TimeoutError, ConnectionError, RendezvousError) as error:
            raise CollectiveTimeout(
                f"rank {self.rank} of {self.world_size}: {what} from rank {source} did not "
                f"arrive within {self.deadline_s:g} s ({error}; a rank died or stalled)"
            ) from None

    # ------------------------------------------------------------------------ collectives
    def all_reduce_sum(self, buffer: Any) -> None:
        buffer = _host(buffer)
        if self.rank != 0:
            self.send(buffer.tobytes())
            buffer[...] = _like(self.receive(0, "all_reduce_sum"), buffer)
            return
        total = buffer.copy()
        for rank in range(1, self.world_size):
            total += _like(self.receive(rank, "all_reduce_sum"), buffer)
        for rank in range(1, self.world_size):
            self.send(total.tobytes(), rank)
        buffer[...] = total

    def broadcast(self, buffer: Any, root: int = 0) -> None:
        buffer = _host(buffer)
        check_root(root, self.world_size)
        if self.rank == 0:
            if root != 0:
                buffer[...] = _like(self.receive(root, "broadcast"), buffer)
            for rank in range(1, self.world_size):
                if rank != root:
                    self.send(buffer.tobytes(), rank)
        elif self.rank == root:
            self.send(buffer.tobytes())
        else:
            buffer[...] = _like(self.receive(0, "broadcast"), buffer)

    def barrier(self) -> None:
        self.all_reduce_sum(np.zeros(1))

    def close(self) -> None:
        for link in self._links.values():
            link.close()


def _host(buffer: Any) -> np.ndarray:
    if not isinstance(buffer, np.ndarray) or not buffer.flags.c_contiguous:
        raise InvalidInput("buffer", "a C-contiguous NumPy array", type(buffer).__name__)
    return buffer


def _like(payload: bytes, buffer: np.ndarray) -> np.ndarray:
    if len(payload) != buffer.nbytes:
        raise InvalidInput("collective", f"{buffer.nbytes} bytes from every rank",
                           f"{len(payload)} bytes")  # fmt: skip
    return np.frombuffer(payload, dtype=buffer.dtype).reshape(buffer.shape)


def _exactly(link: socket.socket, size: int, what: str) -> bytes:
    chunks, left = [], size
    while left:
        chunk = link.recv(min(left, 1 << 20))
        if not chunk:
            raise RendezvousError(f"{what}: the other rank closed the link")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
