"""Admission bounds for the whole server when gRPC runs in front-end processes: server.max_streams,
server.max_concurrent_rpcs and server.max_control_rpcs count every front end's calls together,
not each process's.

The learner process owns the counts (`AdmissionCounts`), each front end's places apart, so a
front end that dies gives its places back at once (`gone`); a front end takes a place (`admit`,
answered on the hub's reader thread: a count under a lock, never a wait) and gives it back
(`leave`, not waited for) through the handoff (`RemoteBound`). Refusals are the front end's to
answer, count and log, as in one process (`admission.Bound.refuse`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from service.config import ServerConfig
from service.errors import InvalidInput
from service.handoff import Handoff
from service.server import learner_calls as calls
from service.server.admission import Bound, Clock


def bound_values(server: ServerConfig) -> dict[str, int]:
    """Each bound's setting and value."""
    return {
        "server.max_streams": server.max_streams,
        "server.max_concurrent_rpcs": server.max_concurrent_rpcs,
        "server.max_control_rpcs": server.max_control_rpcs,
    }


class AdmissionCounts:
    """The learner's count of open calls per bound, per front end."""

    def __init__(self, server: ServerConfig) -> None:
        self.values = bound_values(server)
        self._held: dict[int, Counter[str]] = {}
        self._lock = threading.Lock()

    def open(self, bound: str) -> int:
        with self._lock:
            return sum(held[bound] for held in self._held.values())

    def admit(self, front_end: int, bound: str) -> bool:
        value = self._value(bound)
        with self._lock:
            if sum(held[bound] for held in self._held.values()) >= value:
                return False
            self._held.setdefault(front_end, Counter())[bound] += 1
            return True

    def leave(self, front_end: int, bound: str) -> None:
        self._value(bound)
        with self._lock:
            held = self._held.get(front_end)
            if held is not None and held[bound] > 0:
                held[bound] -= 1

    def gone(self, front_end: int) -> None:
        """A front end's places go back with it."""
        with self._lock:
            self._held.pop(front_end, None)

    def answer(self, front_end: int, name: str, args: dict[str, str]) -> bool | None:
        """The `admit` and `leave` calls (learner_calls)."""
        if name == calls.ADMIT:
            return self.admit(front_end, args["bound"])
        self.leave(front_end, args["bound"])
        return None

    def _value(self, bound: str) -> int:
        value = self.values.get(bound)
        if value is None:
            raise InvalidInput("admission.bound", f"one of {sorted(self.values)}", repr(bound))
        return value


class RemoteBound(Bound):
    """A front-end process's view of a server-wide bound: its places are the learner's."""

    def __init__(
        self,
        setting: str,
        value: int,
        refused: Callable[[str, str], None],
        handoff: Handoff,
        clock: Clock,
    ) -> None:
        super().__init__(setting, value, refused, clock)
        self.handoff = handoff

    def enter(self) -> bool:
        """A place, when the server as a whole has one. With the learner gone the call is let
        through: it finds no learner and is answered UNAVAILABLE, not RESOURCE_EXHAUSTED."""
        try:
            admitted = bool(self.handoff.call(calls.ADMIT, {"bound": self.setting}))
        except Exception:  # Unavailable: answered by the call itself, which finds no learner
            return True
        if admitted:
            with self._lock:
                self.open += 1
        return admitted

    def leave(self) -> None:
        with self._lock:
            self.open -= 1
        if self.handoff.up:
            self.handoff.call_soon(calls.LEAVE, {"bound": self.setting})
