"""The control channel between one front end and the learner: small struct-packed messages over
a Unix SOCK_SEQPACKET socket (the kernel keeps each message whole, so there is no length prefix
to trust, and it carries the slots' file descriptors). Only slot indices, lengths and a small
header cross it; the arrays stay in the slots (layout.py).

Every message starts with `HEAD`: its kind, flags, a slot index and the request id its answer
repeats. The bodies:

    HELLO     front end -> learner  HELLO_BODY: the slots it asks for (limits.SlotSizes)
    WELCOME   learner -> front end  the Act and rollout segments' fds, WELCOME_BODY
    ACT       front end -> learner  ACT_BODY: rows, mode, epsilon; obs in the Act slot
    ACTED     learner -> front end  ACTED_BODY: the policy version; outputs in the Act slot
    ROLLOUT   front end -> learner  ROLLOUT_BODY + RolloutShape.PACKED + the key's actor id
                                    (ROLLOUT_BODY's length, utf-8) + the client (utf-8, the rest)
    QUEUED    learner -> front end  the ROLLOUT with this request id has a place in the Step
                                    queue (a stream's rollout waits for room there first); its
                                    STEPPED or FAILED comes later
    STEPPED   learner -> front end  the Step's result (JSON: a few numbers, not arrays)
    FAILED    learner -> front end  the error (JSON: its class in service.errors, message)
    CALL      front end -> learner  a control call (JSON: name, arguments)
    ANSWER    learner -> front end  its answer (JSON)
    SEAT      front end -> learner  SEAT_BODY: an Interact stream's seat opens (its columns),
                                    waits, resumes or closes; no answer (the channel keeps order,
                                    so a stream's ROLLOUTs always find its seat open)
    ABANDON   front end -> learner  the caller of the ROLLOUT with this request id left: the
                                    learner drops it unless its Step has started; no answer
    ASK       learner -> front end  a request of the learner's own (its request id numbers it):
                                    the front end answers with a CALL (e.g. its metrics for a
                                    scrape)

A reply with the flag RELEASED frees the slot it names: the learner reads it no more.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import json
import socket
import struct
import threading
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from service import errors
from service.types import StepResult

PROTOCOL = 1  # HELLO's version: both sides run the same tree


class Kind(IntEnum):
    HELLO = 1
    WELCOME = 2
    ACT = 3
    ACTED = 4
    ROLLOUT = 5
    STEPPED = 6
    FAILED = 7
    CALL = 8
    ANSWER = 9
    SEAT = 10
    ABANDON = 11
    ASK = 12
    QUEUED = 13


class SeatOp(IntEnum):
    """What a SEAT message says of a stream's seat (`learner_api.StreamSeat`)."""

    OPEN = 1  # with the stream's columns
    WAIT = 2  # the stream sends nothing until RESUME
    RESUME = 3
    CLOSE = 4


HEAD = struct.Struct("<BBHQ")  # kind, flags, slot, request id
RELEASED = 1  # flag: the slot is free again
KEYED = 2  # flag on ROLLOUT: an actor id (utf-8) follows the shape, the key's sequence is set
HELLO_BODY = struct.Struct("<IIIIIQ")  # protocol, obs_dim, act_slots, act_rows, rollout_slots,
# rollout slot bytes
WELCOME_BODY = struct.Struct("<I")  # the front end's id at the learner
ACT_BODY = struct.Struct("<IBf")  # rows, mode (index in ActMode), epsilon
ACTED_BODY = struct.Struct("<q")  # policy version
ROLLOUT_BODY = struct.Struct("<qQQH")  # policy version (-1: none), stream id, key sequence,
# the actor id's length in bytes
SEAT_BODY = struct.Struct("<QBI")  # stream id, SeatOp, columns (OPEN's; else 0)
MAX_MESSAGE = 1 << 16  # bytes: a message's most (a JSON result, an actor id)
MAX_CLIENT = 512  # bytes of a ROLLOUT's client name carried (a peer address; longer is cut)
MAX_FDS = 2


@dataclass(frozen=True)
class Message:
    kind: Kind
    flags: int
    slot: int
    request: int
    body: bytes
    fds: list[int]


class Channel:
    """One end of the connection. `send` may be called from any thread (one message at a time);
    `receive` from one reader. A peer that exited, or was killed, reads as None."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, kind: Kind, request: int = 0, slot: int = 0, flags: int = 0,
             body: bytes = b"", fds: tuple[int, ...] = ()) -> None:  # fmt: skip
        message = HEAD.pack(kind, flags, slot, request) + body
        with self._send_lock:
            if fds:
                socket.send_fds(self.sock, [message], list(fds))
            else:
                self.sock.send(message)

    def receive(self) -> Message | None:
        """The next message; None once the peer is gone (EOF, reset) or the socket closed."""
        try:
            data, fds, flags, _ = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS)
        except TimeoutError:  # the socket's own timeout: the caller's to handle
            raise
        except OSError:
            return None
        if not data:
            return None
        if flags & socket.MSG_TRUNC or len(data) < HEAD.size:
            raise ValueError(f"handoff: a message of {len(data)} bytes does not parse")
        kind, mflags, slot, request = HEAD.unpack_from(data)
        return Message(Kind(kind), mflags, slot, request, data[HEAD.size :], list(fds))

    def close(self) -> None:
        """Shut the connection both ways (a reader blocked on it wakes to EOF), then close it."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def peer_pid(sock: socket.socket) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = array.array("i")
    creds.frombytes(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    pid, uid, _ = creds
    return pid, uid


# ---------------------------------------------------------------------- small payloads as JSON
def to_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def error_body(error: BaseException) -> bytes:
    """An error as its class name in service.errors (else RuntimeError) and its message."""
    body: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, errors.InvalidInput):
        body.update(field=error.field, expected=error.expected, got=str(error.got))
    return to_json(body)


def _error_classes() -> dict[str, type[errors.TridentError]]:
    found, todo = {}, [errors.TridentError]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def error_from(body: bytes) -> Exception:
    """The error `error_body` wrote, as the same class where service.errors has it."""
    fields = json.loads(body)
    cls = _error_classes().get(fields["type"])
    if cls is errors.InvalidInput:
        return errors.InvalidInput(fields["field"], fields["expected"], fields["got"])
    if cls is None:
        return RuntimeError(f"{fields['type']}: {fields['message']}")
    error = cls.__new__(cls)
    Exception.__init__(error, fields["message"])
    return error


def result_body(result: StepResult) -> bytes:
    return to_json(dataclasses.asdict(result))


def result_from(body: bytes) -> StepResult:
    return StepResult(**json.loads(body))
