"""TrainerService over gRPC: protobuf <-> NumPy translation around the learner process, nothing
more. The servicer knows the learner by its seam alone (`learner_api.LearnerApi`)."""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np

from service import logs
from service.api import wire
from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.errors import InvalidInput, Unavailable
from service.server.interact import InteractSteps, Outcome
from service.server.learner_api import LearnerApi
from service.server.metrics import Metrics
from service.server.status import drop_reason, status_of
from service.server.validation import (
    act_inputs,
    group_step,
    interact_start,
    key_from_request,
    rollout_from_request,
)
from service.types import ActMode, CheckpointInfo, StepResult
from service.unroll import GroupStep, Unroller

Handler = TypeVar("Handler", bound=Callable[..., Any])
# Error details travel in trailing metadata; clients drop a stream whose metadata passes 8 KiB.
MAX_MESSAGE_CHARS = 2000
# a stream's end waits this long (s) for a cancel's second event (`_closed`)
CANCEL_SETTLE_S = 0.05
# A call its client ended this close to its deadline ended for the deadline: the client's clock
# starts before the server has read the call's headers, so the client's deadline passes first
# and its cancel can reach the server while the server's own copy still has milliseconds left.
DEADLINE_SLACK_S = 0.25
# After a client's first refusal of a kind (a full Step queue, a stale rollout, one bad field),
# its later ones of that kind are logged as one count line this often (s); each is counted in
# trident_rpc_errors_total as it happens.
REFUSAL_LOG_EVERY_S = 60.0


def refusal_kind(error: Exception) -> str:
    """What a refusal is logged once per client for: why its rollout was dropped, the field a
    bad input got wrong, else the error's type."""
    if isinstance(error, InvalidInput):
        return f"field {error.field}"
    return drop_reason(error) or type(error).__name__


def request_id_of(context: grpc.ServicerContext) -> str:
    """The caller's `x-request-id` metadata, or a fresh one."""
    for key, value in context.invocation_metadata():
        if key == "x-request-id" and value:
            return str(value)[:128]
    return uuid.uuid4().hex


# Every StepResponse field is the StepResult attribute of the same name.
STEP_RESPONSE_FIELDS = tuple(field.name for field in pb.StepResponse.DESCRIPTOR.fields)


def step_response(result: StepResult) -> pb.StepResponse:
    return pb.StepResponse(**{name: getattr(result, name) for name in STEP_RESPONSE_FIELDS})


def outcome_message(outcome: Outcome) -> pb.InteractOutcome:
    """An Interact outcome: the Step's reply, or the status it was refused with (INTERNAL,
    without details, for what is no domain error)."""
    if outcome.result is not None:
        return pb.InteractOutcome(sequence=outcome.sequence, step=step_response(outcome.result))
    assert outcome.error is not None
    code = status_of(outcome.error)
    if code is None:
        logs.logger.error("internal error in an Interact Step", exc_info=outcome.error)
        code, message = grpc.StatusCode.INTERNAL, "internal error"
    else:
        message = str(outcome.error)[:MAX_MESSAGE_CHARS]
    return pb.InteractOutcome(
        sequence=outcome.sequence, error_code=code.value[0], error_message=message
    )


@dataclass(frozen=True)
class Undecodable:
    """A request whose bytes do not parse, in place of the message. gRPC answers a deserializer
    that raises with its own INTERNAL "Exception deserializing request!" (no request id, no log
    line, no count), so the deserializer hands this to the method instead, which refuses it
    (`decoded`) as it refuses any bad input."""

    type_name: str
    reason: str


def lenient(parse: Callable[[bytes], Any], type_name: str) -> Callable[[bytes], Any]:
    """`parse`, answering Undecodable where it raises."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as error:  # DecodeError, or whatever a parser raises on such bytes
            return Undecodable(type_name, str(error) or type(error).__name__)

    return deserialize


RequestT = TypeVar("RequestT")


def decoded(request: RequestT | Undecodable) -> RequestT:
    """`request`, or InvalidInput (INVALID_ARGUMENT) when its bytes did not parse."""
    if isinstance(request, Undecodable):
        raise InvalidInput(
            "request",
            f"a serialized {request.type_name} message",
            f"bytes that do not parse ({request.reason})",
        )
    return request


SERVICE = pb.DESCRIPTOR.services_by_name["TrainerService"]
HANDLER_KINDS = {  # (client streaming, server streaming) -> gRPC's handler constructor
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def method_handlers(servicer: pb_grpc.TrainerServiceServicer) -> dict[str, grpc.RpcMethodHandler]:
    """TrainerService's methods on `servicer`, as the generated `add_*_to_server` registers
    them, except that a request holding tensors is read in place (`service.api.wire`: the
    tensors' bytes are not copied) instead of by protobuf's parser, and that bytes which do
    not parse reach the method as an Undecodable (answered INVALID_ARGUMENT)."""
    handlers = {}
    for method in SERVICE.methods:
        request, response = method.input_type, method.output_type
        parse = (wire.deserializer(request) if wire.holds_tensors(request)
                 else getattr(pb, request.name).FromString)  # fmt: skip
        handlers[method.name] = HANDLER_KINDS[method.client_streaming, method.server_streaming](
            getattr(servicer, method.name),
            request_deserializer=lenient(parse, request.full_name),
            response_serializer=getattr(pb, response.name).SerializeToString,
        )
    return handlers


class EpisodeReturns:
    """One Interact stream's running episode returns, per environment: each outcome's rewards
    added, and the returns of the episodes that ended (terminated or truncated) handed to
    `ended`. An episode that began before the stream opened counts from the stream's start."""

    def __init__(self, unroller: Unroller, ended: Callable[[float], None]) -> None:
        self.unroller, self.ended = unroller, ended
        self.sums = np.zeros(unroller.N)

    def add(self, group: int, step: GroupStep) -> None:
        if step.rewards is None:  # a group's first request: no outcome yet
            return
        lo = self.unroller.starts[group]
        sums = self.sums[lo : lo + step.rewards.shape[0]]
        sums += step.rewards
        done = step.terminated | step.truncated
        if done.any():
            for value in sums[done].tolist():
                self.ended(value)
            sums[done] = 0.0


def checkpoint_message(info: CheckpointInfo) -> pb.CheckpointInfo:
    return pb.CheckpointInfo(
        name=info.name,
        global_step=info.global_step,
        size_bytes=info.size_bytes,
        created_unix=info.created_unix,
        save_ms=info.save_ms,
        commit_sequence=info.commit_sequence,
    )


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    """Each method decodes, calls the learner, encodes; errors go through `status_of`.
    `clock` (seconds) times Interact's requests."""

    def __init__(self, metrics: Metrics, clock: Callable[[], float] = time.perf_counter) -> None:
        self.metrics, self.clock = metrics, clock
        self._learner: LearnerApi | None = None
        self._draining = False
        self._refusals = logs.Throttled(REFUSAL_LOG_EVERY_S)

    def attach(self, learner: LearnerApi) -> None:
        """Start answering with `learner`; until then every call is UNAVAILABLE."""
        self._learner = learner

    def refuse_new_calls(self) -> None:
        """Answer every call that starts from now on UNAVAILABLE, while the server still runs.

        The servicer refuses rather than the closing listener because gRPC core answers a call
        that races its shutdown with CANCELLED, which a client must not read as retryable.
        """
        self._draining = True

    def flush_logs(self) -> None:
        """Log the refusals counted and not yet said (the server is about to stop)."""
        self._refusals.flush()

    @property
    def learner(self) -> LearnerApi:
        if self._draining:
            raise Unavailable("the server is draining and takes no new calls; retry elsewhere")
        if self._learner is None:
            raise Unavailable("the trainer is still being built; retry shortly")
        return self._learner

    def _fail(
        self, method: str, error: Exception, context: grpc.ServicerContext, request_id: str
    ) -> None:
        if isinstance(error, grpc.RpcError):
            self._client_gone(method, context, request_id)
            return
        code = status_of(error)
        if code is None:
            logs.logger.error(
                "internal error",
                exc_info=error,
                extra={"fields": {"method": method, "request_id": request_id}},
            )
            code, message = grpc.StatusCode.INTERNAL, f"internal error (request id {request_id})"
        else:
            message = str(error)
            if len(message) > MAX_MESSAGE_CHARS:  # it travels in trailing metadata (8 KiB limit)
                message = f"{message[: MAX_MESSAGE_CHARS - 40]}... ({len(message)} chars in all)"
            kind = refusal_kind(error)
            self._refusals.event(logging.INFO, "rejected", (context.peer(), method, kind),
                                 method=method, code=code.name, kind=kind, client=context.peer(),
                                 request_id=request_id, reason=message)  # fmt: skip
        self.metrics.rpc_error(method, code)
        context.abort(code, message)

    def _client_gone(self, method: str, context: grpc.ServicerContext, request_id: str) -> None:
        """A stream that ended under the server (its client cancelled it or closed the
        connection, its deadline passed, a drain's grace ran out): gRPC's request iterator
        raises a bare RpcError then. Nothing is left to answer; it is counted as what it is,
        DEADLINE_EXCEEDED when the call's deadline has passed (or is DEADLINE_SLACK_S away)
        and CANCELLED otherwise, and logged at INFO, not as an internal error."""
        past_deadline = context.time_remaining() < DEADLINE_SLACK_S
        code = grpc.StatusCode.DEADLINE_EXCEEDED if past_deadline else grpc.StatusCode.CANCELLED
        reason = (
            "the call's deadline passed before its answer"
            if past_deadline
            else "the call ended before its answer: cancelled or its connection closed"
        )
        logs.event(
            logging.INFO,
            "cancelled",
            method=method,
            code=code.name,
            request_id=request_id,
            reason=reason,
            active=context.is_active(),
        )
        self.metrics.rpc_error(method, code)

    def _closed(self, method: str, context: grpc.ServicerContext, request_id: str) -> None:
        """A stream's requests or responses ended: gRPC stops reading a call's response
        iterator once the call has ended, and ends its request iterator on a half-close or a
        cancel. A cancel reaches the handler as two events, its message stream's end and then
        the call's end, so a stream whose requests ended while it is still active waits up to
        CANCEL_SETTLE_S for the second: a cancel is counted, a half-close answered OK."""
        deadline = time.monotonic() + CANCEL_SETTLE_S
        while context.is_active() and time.monotonic() < deadline:
            time.sleep(CANCEL_SETTLE_S / 25)
        if not context.is_active():
            self._client_gone(method, context, request_id)

    @staticmethod
    def _rpc(method: str) -> Callable[[Handler], Handler]:
        def wrap(handler: Handler) -> Handler:
            @functools.wraps(handler)
            def unary(self: TrainerServicer, request: Any, context: grpc.ServicerContext) -> Any:
                request_id = request_id_of(context)
                context.set_trailing_metadata((("x-request-id", request_id),))
                try:
                    return handler(self, decoded(request), context)
                except Exception as error:
                    self._fail(method, error, context, request_id)

            return unary  # type: ignore[return-value]

        return wrap

    @_rpc("Step")
    def Step(self, request: pb.StepRequest, context: grpc.ServicerContext) -> pb.StepResponse:
        rollout = rollout_from_request(request, self.learner.config)
        key = key_from_request(request)
        future = self.learner.submit_step(rollout, context.is_active, key, client=context.peer())
        return step_response(future.result())

    def StreamStep(
        self, request_iterator: Iterator[pb.StreamStepRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.StreamStepResponse]:
        request_id = request_id_of(context)
        context.set_trailing_metadata((("x-request-id", request_id),))
        try:
            for undecoded in request_iterator:
                request = decoded(undecoded)
                rollout = rollout_from_request(request.step, self.learner.config)
                key = key_from_request(request.step)
                result = self.learner.submit_step(rollout, context.is_active, key,
                                                  client=context.peer()).result()  # fmt: skip
                yield pb.StreamStepResponse(step=step_response(result))
            # gRPC may end the request iterator of a cancelled call instead of raising
            self._closed("StreamStep", context, request_id)
        except GeneratorExit:
            self._closed("StreamStep", context, request_id)
            raise
        except Exception as error:
            self._fail("StreamStep", error, context, request_id)

    def Interact(
        self, request_iterator: Iterator[pb.InteractRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.InteractResponse]:
        request_id = request_id_of(context)
        context.set_trailing_metadata((("x-request-id", request_id),))
        self.metrics.interact_streams.inc()
        try:
            yield from self._interact(request_iterator, context)
            # gRPC may end the request iterator of a cancelled call instead of raising
            self._closed("Interact", context, request_id)
        except GeneratorExit:
            self._closed("Interact", context, request_id)
            raise
        except Exception as error:
            self._fail("Interact", error, context, request_id)
        finally:
            self.metrics.interact_streams.dec()

    def _interact(
        self, requests: Iterator[pb.InteractRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.InteractResponse]:
        """Per request: the group's outcome into its rollout, a completed rollout to the Step
        queue while the group's actions are sampled from the published policy (after its Step,
        on a synchronous stream), the actions back."""
        request = next(requests, None)
        if request is None:
            return
        request = decoded(request)
        learner = self.learner
        learner.require_training("Interact")
        config = learner.config
        actor, first_sequence, T, groups, synchronous = interact_start(request, config)
        unroller = Unroller(T, groups, config.model.obs_dim, recycling=True,
                            empty=learner.host_empty)  # fmt: skip
        steps = InteractSteps(learner, actor, first_sequence, unroller.N, context.is_active,
                              unroller.recycle)  # fmt: skip
        clock, latency = self.clock, self.metrics.interact_request_duration
        returns = EpisodeReturns(unroller, self.metrics.episode_return.observe)
        try:
            while request is not None:
                arrived = clock()
                step = group_step(request, config)
                completed = unroller.observe(request.group, step)
                returns.add(request.group, step)
                if synchronous:  # the actions wait for the Steps of the rollouts completed
                    for k, rollout in completed:
                        steps.submit(k, rollout)
                        steps.finish()
                # UNAVAILABLE on a drain. The Act runs while a completed rollout is handed over.
                acting = learner.submit_act(step.obs, ActMode.SAMPLE, 0.0)
                if not synchronous:
                    for k, rollout in completed:
                        steps.submit(k, rollout)
                acted = acting.result()
                unroller.acted(request.group, acted.actions, acted.log_probs,
                               acted.policy_version)  # fmt: skip
                response = pb.InteractResponse(
                    group=request.group,
                    actions=encode(acted.actions.astype("<i4")),
                    log_probs=encode(acted.log_probs.astype("<f4")),
                    policy_version=acted.policy_version,
                    outcomes=[outcome_message(o) for o in steps.take_outcomes()],
                )
                latency.observe(clock() - arrived)
                yield response
                request = next(requests, None)
                request = None if request is None else decoded(request)
                if request is not None and request.HasField("start"):
                    raise InvalidInput("start", "on the stream's first request alone", "again")
            steps.finish()
            yield pb.InteractResponse(
                group=-1, outcomes=[outcome_message(o) for o in steps.take_outcomes()]
            )
        finally:
            steps.close()

    @_rpc("Act")
    def Act(self, request: pb.ActRequest, context: grpc.ServicerContext) -> pb.ActResponse:
        obs, mode, epsilon = act_inputs(request, self.learner.config)
        result = self.learner.submit_act(obs, mode, epsilon).result()
        return pb.ActResponse(
            actions=encode(result.actions.astype("<i4")),
            log_probs=encode(result.log_probs.astype("<f4")),
            values=encode(result.values.astype("<f4")),
            policy_version=result.policy_version,
        )

    @_rpc("Checkpoint")
    def Checkpoint(
        self, request: pb.CheckpointRequest, context: grpc.ServicerContext
    ) -> pb.CheckpointResponse:
        name = request.name if request.HasField("name") else None
        info = self.learner.checkpoint(name)
        return pb.CheckpointResponse(checkpoint=checkpoint_message(info))

    @_rpc("Restore")
    def Restore(
        self, request: pb.RestoreRequest, context: grpc.ServicerContext
    ) -> pb.RestoreResponse:
        info, digest = self.learner.restore(request.name)
        return pb.RestoreResponse(checkpoint=checkpoint_message(info), param_digest=digest)

    @_rpc("ListCheckpoints")
    def ListCheckpoints(
        self, request: pb.ListCheckpointsRequest, context: grpc.ServicerContext
    ) -> pb.ListCheckpointsResponse:
        infos = self.learner.list_checkpoints()
        return pb.ListCheckpointsResponse(checkpoints=[checkpoint_message(i) for i in infos])

    @_rpc("GetStatus")
    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetStatusResponse:
        return self.learner.status()

    @_rpc("UpdateHyperparams")
    def UpdateHyperparams(
        self, request: pb.UpdateHyperparamsRequest, context: grpc.ServicerContext
    ) -> pb.UpdateHyperparamsResponse:
        config_json = self.learner.update_hyperparams(dict(request.values))
        return pb.UpdateHyperparamsResponse(config_json=config_json)
