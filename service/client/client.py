"""A typed Python client of TrainerService: NumPy in, NumPy out.

Every call has a deadline. Only calls that are safe to repeat are retried, with exponential
backoff: Act, GetStatus and ListCheckpoints on UNAVAILABLE, and a Step that carries an
idempotency key (`step(..., key=StepKey(actor, sequence))`) on any transient status, since the
server answers a key it applied with the original reply instead of applying it again. A Step
without a key, Checkpoint, Restore and UpdateHyperparams are never retried.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.api.tensors import decode, encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.config import ServerConfig
from service.step_ledger import StepKey
from service.types import ActMode, ActResult, Rollout, StepResult

if TYPE_CHECKING:
    from service.client.interact import InteractStream

Reply = TypeVar("Reply")
MAX_BACKOFF_S = 2.0

DEFAULT_PORT = ServerConfig().port  # what `trident serve` listens on unless told otherwise
# gRPC target schemes (gRPC's naming doc); a target with one is passed on as it is
SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:", "xds:")

MODES = {
    ActMode.SAMPLE: pb.ACT_MODE_SAMPLE,
    ActMode.GREEDY_PI: pb.ACT_MODE_GREEDY_PI,
    ActMode.GREEDY_Q: pb.ACT_MODE_GREEDY_Q,
    ActMode.EPSILON_GREEDY: pb.ACT_MODE_EPSILON_GREEDY,
}


# A Step's reply is the Step's StepResult: the server writes every StepResponse field from the
# StepResult attribute of the same name (servicer.step_response) and `step_reply` reads them back,
# so a new field is the proto's and StepResult's, nothing here.
StepReply = StepResult


def step_reply(message: pb.StepResponse) -> StepResult:
    """The StepResult a StepResponse carries: each field into the attribute of its name (maps
    as dicts, repeated fields as lists); what the proto does not carry keeps its default."""
    values: dict[str, Any] = {}
    for name in (f.name for f in pb.StepResponse.DESCRIPTOR.fields):
        value = getattr(message, name)
        if isinstance(value, Mapping):
            value = dict(value)
        elif not isinstance(value, str | bytes | int | float):
            value = list(value)
        values[name] = value
    return StepResult(**values)


def step_request(rollout: Rollout, key: StepKey | None = None) -> pb.StepRequest:
    """The StepRequest of a rollout (float32 observations, int32 actions, uint8 flags)."""
    fields: dict[str, Any] = {
        "obs": encode(rollout.obs.astype("<f4")),
        "actions": encode(rollout.actions.astype("<i4")),
        "rewards": encode(rollout.rewards.astype("<f4")),
        "terminated": encode(rollout.terminated.astype(np.uint8)),
        "truncated": encode(rollout.truncated.astype(np.uint8)),
        "behavior_log_probs": encode(rollout.behavior_log_probs.astype("<f4")),
    }
    if rollout.final_obs is not None and rollout.final_obs_index is not None:
        fields["final_obs"] = encode(rollout.final_obs.astype("<f4"))
        fields["final_obs_index"] = encode(rollout.final_obs_index.astype("<i8"))
    if rollout.bce_labels is not None:
        fields["bce_labels"] = encode(rollout.bce_labels.astype(np.uint8))
    if rollout.aux_targets is not None:
        fields["aux_targets"] = encode(rollout.aux_targets.astype("<f4"))
    if rollout.policy_version is not None:
        fields["policy_version"] = rollout.policy_version
    if key is not None:
        fields["idempotency_key"] = pb.StepKey(actor_id=key.actor, sequence=key.sequence)
    return pb.StepRequest(**fields)


def with_default_port(target: str) -> str:
    """`target` with DEFAULT_PORT where it names a host alone ("localhost", "10.0.0.5", "::1",
    "[::1]"): gRPC would try port 443 there, where no Trident server listens."""
    if target.startswith(SCHEMES):
        return target
    if target.startswith("["):  # a bracketed IPv6 address, with or without a port
        return target if "]:" in target else f"{target}:{DEFAULT_PORT}"
    colons = target.count(":")
    if colons == 0:
        return f"{target}:{DEFAULT_PORT}"
    return f"[{target}]:{DEFAULT_PORT}" if colons > 1 else target  # bare IPv6, or HOST:PORT


def answered(error: grpc.RpcError) -> bool:
    """Whether a Trident server's handler answered with `error`: they send the call's
    x-request-id back in trailing metadata. False when gRPC failed before one ran: nothing
    listening, a name that does not resolve, a TLS mismatch, a deadline spent connecting."""
    trailing = error.trailing_metadata() or ()  # type: ignore[attr-defined]
    return any(key == "x-request-id" for key, _ in trailing)


def channel_credentials(
    root_cert: str | None, client_cert: str | None, client_key: str | None
) -> grpc.ChannelCredentials:
    """TLS credentials from PEM files (a client pair only for mTLS)."""
    read = lambda path: Path(path).read_bytes() if path else None  # noqa: E731
    return grpc.ssl_channel_credentials(read(root_cert), read(client_key), read(client_cert))


class TridentClient:
    """One channel to one server. Use as a context manager or call `close()`.

    `target` is HOST:PORT (HOST alone means port DEFAULT_PORT) or a gRPC target URI;
    `interceptors` wrap the unary calls (tracing, or faults in tests)."""

    RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
    # A keyed Step may be sent again whatever became of the last try: one that was applied is
    # answered from the server's ledger.
    RETRYABLE_KEYED = (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
    )

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout_s: float = 60.0,
        retries: int = 3,
        max_message_mb: int = 64,
        interceptors: Sequence[grpc.UnaryUnaryClientInterceptor] = (),
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        """`options`: more channel arguments (e.g. ("grpc.use_local_subchannel_pool", 1) for
        a connection of the client's own, not shared with other channels to the target)."""
        limit = max_message_mb * 1024 * 1024
        options = [
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
            *options,
        ]
        self.target = with_default_port(target)
        if credentials is None:
            self._channel = grpc.insecure_channel(self.target, options=options)
        else:
            self._channel = grpc.secure_channel(self.target, credentials, options=options)
        intercepted = grpc.intercept_channel(self._channel, *interceptors)
        self._stub = pb_grpc.TrainerServiceStub(intercepted)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._token = token
        self.timeout_s = timeout_s
        self.retries = retries

    def __enter__(self) -> TridentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    @property
    def stub(self) -> pb_grpc.TrainerServiceStub:
        """The generated TrainerService stub on this client's channel, for what the typed
        methods do not offer (call futures, hand-built requests, metadata of your own). Its
        calls carry none of this client's token, deadline or retries."""
        return self._stub

    def _metadata(self) -> list[tuple[str, str]]:
        metadata = [("x-request-id", uuid.uuid4().hex)]
        if self._token:
            metadata.append(("authorization", f"Bearer {self._token}"))
        return metadata

    def _call(
        self,
        method: Callable[..., Reply],
        request: Any,
        *,
        idempotent: bool,
        timeout_s: float | None = None,
        retryable: tuple[grpc.StatusCode, ...] = RETRYABLE,
    ) -> Reply:
        attempts = 1 + (self.retries if idempotent else 0)
        for attempt in range(attempts):
            try:
                return method(
                    request, timeout=timeout_s or self.timeout_s, metadata=self._metadata()
                )
            except grpc.RpcError as error:
                if attempt + 1 == attempts or error.code() not in retryable:
                    raise
                # Full jitter: retries of many actors after one outage spread out.
                time.sleep(random.uniform(0, min(MAX_BACKOFF_S, 0.05 * 2**attempt)))
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------------ training
    def step(
        self, rollout: Rollout, timeout_s: float | None = None, key: StepKey | None = None
    ) -> StepReply:
        """Apply one rollout. With a `key` (unique per rollout of this actor) the Step is
        retried on transient errors and applied once however often it is sent."""
        reply = self._call(
            self._stub.Step,
            step_request(rollout, key),
            idempotent=key is not None,
            timeout_s=timeout_s,
            retryable=self.RETRYABLE_KEYED,
        )
        return step_reply(reply)

    def stream_step(self, rollouts: Iterable[Rollout]) -> Iterator[StepReply]:
        """One reply per rollout, in order, over one stream."""
        requests = (pb.StreamStepRequest(step=step_request(r)) for r in rollouts)
        for reply in self._stub.StreamStep(requests, metadata=self._metadata()):
            yield step_reply(reply.step)

    def interact(
        self,
        actor_id: str,
        first_sequence: int,
        rollout_len: int,
        group_envs: Sequence[int],
        synchronous: bool = False,
    ) -> InteractStream:
        """Open an Interact stream (service/client/interact.py): the server acts on each
        group's observations and trains on the rollouts it assembles, keyed (actor_id,
        first_sequence + k); `synchronous`: a rollout's first actions wait for the previous
        rollout's Step. No deadline: the stream lives as long as the actor."""
        from service.client.interact import InteractStream  # it reads this module's replies

        start = pb.InteractStart(
            actor_id=actor_id,
            first_sequence=first_sequence,
            rollout_len=rollout_len,
            group_envs=list(group_envs),
            synchronous=synchronous,
        )
        return InteractStream(self._stub.Interact, self._metadata(), start)

    def act(
        self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE, epsilon: float = 0.0
    ) -> ActResult:
        request = pb.ActRequest(
            obs=encode(np.asarray(obs, "<f4")), mode=MODES[mode], epsilon=epsilon
        )
        reply = self._call(self._stub.Act, request, idempotent=True)
        return ActResult(
            actions=decode(reply.actions, "actions", (pb.D_TYPE_INT32,)),
            log_probs=decode(reply.log_probs, "log_probs", (pb.D_TYPE_FLOAT32,)),
            values=decode(reply.values, "values", (pb.D_TYPE_FLOAT32,)),
            policy_version=reply.policy_version,
        )

    # ------------------------------------------------------------------------ state
    def checkpoint(self, name: str | None = None) -> pb.CheckpointInfo:
        request = pb.CheckpointRequest() if name is None else pb.CheckpointRequest(name=name)
        return self._call(self._stub.Checkpoint, request, idempotent=False).checkpoint

    def restore(self, name: str) -> pb.RestoreResponse:
        return self._call(self._stub.Restore, pb.RestoreRequest(name=name), idempotent=False)

    def list_checkpoints(self) -> list[pb.CheckpointInfo]:
        reply = self._call(self._stub.ListCheckpoints, pb.ListCheckpointsRequest(), idempotent=True)
        return list(reply.checkpoints)

    def status(self) -> pb.GetStatusResponse:
        return self._call(self._stub.GetStatus, pb.GetStatusRequest(), idempotent=True)

    def update_hyperparams(self, values: Mapping[str, float]) -> str:
        request = pb.UpdateHyperparamsRequest(values=dict(values))
        return self._call(self._stub.UpdateHyperparams, request, idempotent=False).config_json

    def health(self, service: str = "") -> str:
        """The health status name (SERVING, NOT_SERVING, ...) of `service` ('' = the server)."""
        reply = self._health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=self.timeout_s
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
