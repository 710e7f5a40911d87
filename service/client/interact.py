"""The client side of Interact: one open stream, requests sent as they are made, replies read
in order (`TridentClient.interact`)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from service.api.tensors import decode, encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.client.client import StepReply, step_reply
from service.vector_env import EnvStep

_CLOSE = None  # ends the request iterator: the client's half-close


@dataclass(frozen=True)
class InteractOutcome:
    """What became of the stream's rollout `sequence`: the Step's reply, or a refusal."""

    sequence: int
    reply: StepReply | None
    code: grpc.StatusCode | None
    message: str


@dataclass(frozen=True)
class InteractReply:
    """The answer to one request: the group's actions, and the outcomes that came with it."""

    group: int  # -1 on the closing reply
    actions: np.ndarray  # [n] int32 (empty on the closing reply)
    log_probs: np.ndarray  # [n] float32
    policy_version: int
    outcomes: list[InteractOutcome]


CODES = {code.value[0]: code for code in grpc.StatusCode}


def interact_request(group: int, obs: np.ndarray, outcome: EnvStep | None) -> pb.InteractRequest:
    """The request of `group`'s env step: its observations now and, after its first request,
    the outcome of its previous actions (final observations indexed by environment)."""
    fields: dict[str, Any] = {"group": group, "obs": encode(np.asarray(obs, "<f4"))}
    if outcome is not None:
        fields["rewards"] = encode(np.asarray(outcome.rewards, "<f4"))
        fields["terminated"] = encode(np.asarray(outcome.terminated, np.uint8))
        fields["truncated"] = encode(np.asarray(outcome.truncated, np.uint8))
        if outcome.final_obs.shape[0]:
            fields["final_obs"] = encode(np.asarray(outcome.final_obs, "<f4"))
            fields["final_obs_index"] = encode(np.flatnonzero(outcome.truncated).astype("<i8"))
        if outcome.bce_labels is not None:
            fields["bce_labels"] = encode(np.asarray(outcome.bce_labels, np.uint8))
        if outcome.aux_targets is not None:
            fields["aux_targets"] = encode(np.asarray(outcome.aux_targets, "<f4"))
    return pb.InteractRequest(**fields)


def _outcome(message: pb.InteractOutcome) -> InteractOutcome:
    if message.HasField("step"):
        return InteractOutcome(message.sequence, step_reply(message.step), None, "")
    code = CODES.get(message.error_code, grpc.StatusCode.UNKNOWN)
    return InteractOutcome(message.sequence, None, code, message.error_message)


class InteractStream:
    """An open Interact call. `send` queues a request (the first carries `start`), `receive`
    blocks for the next reply, `close` half-closes: the server then answers what is left and
    a closing reply with the last outcomes. A broken stream raises grpc.RpcError from
    `receive`."""

    def __init__(self, method: Any, metadata: list[tuple[str, str]], start: pb.InteractStart):
        self._requests: queue.SimpleQueue[pb.InteractRequest | None] = queue.SimpleQueue()
        self._start: pb.InteractStart | None = start
        self._call = method(iter(self._requests.get, _CLOSE), metadata=metadata)
        self._replies: Iterator[pb.InteractResponse] = self._call

    def send(self, group: int, obs: np.ndarray, outcome: EnvStep | None) -> None:
        request = interact_request(group, obs, outcome)
        if self._start is not None:
            request.start.CopyFrom(self._start)
            self._start = None
        self._requests.put(request)

    def receive(self) -> InteractReply | None:
        """The next reply; None once the server has closed the stream."""
        message = next(self._replies, None)
        if message is None:
            return None
        outcomes = [_outcome(o) for o in message.outcomes]
        if message.group < 0:
            empty = np.zeros(0, np.int32)
            return InteractReply(-1, empty, empty.astype(np.float32), 0, outcomes)
        return InteractReply(
            group=message.group,
            actions=decode(message.actions, "actions", (pb.D_TYPE_INT32,)),
            log_probs=decode(message.log_probs, "log_probs", (pb.D_TYPE_FLOAT32,)),
            policy_version=message.policy_version,
            outcomes=outcomes,
        )

    def close(self) -> None:
        self._requests.put(_CLOSE)

    def cancel(self) -> None:
        self._call.cancel()
