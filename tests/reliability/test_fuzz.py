"""Fuzzing the gRPC surface: >= 10,000 mutated Step, Act, Checkpoint and Restore messages.

Every message goes through one real `trident serve` process over a real channel with raw stubs,
so malformed tensors reach the server. No call may crash it or come back UNKNOWN or INTERNAL;
every error names what was expected and what came; rejected calls change no parameter.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import random_rollout, running_server
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.client.client import step_request
from service.server.validation import STEP_FIELDS
from service.testing.serverproc import ServerProcess

Code = grpc.StatusCode
ALLOWED = {
    Code.OK,
    Code.INVALID_ARGUMENT,
    Code.FAILED_PRECONDITION,
    Code.OUT_OF_RANGE,
    Code.NOT_FOUND,
    Code.RESOURCE_EXHAUSTED,
}
BATCH = 25  # messages per Hypothesis example, sent concurrently
STEP_EXAMPLES, ACT_EXAMPLES, NAME_EXAMPLES = 160, 120, 120  # x BATCH = 10,000 messages
REQUIRED = [name for name, (_, required) in STEP_FIELDS.items() if required]
FLOAT_FIELDS = [name for name, (dtypes, _) in STEP_FIELDS.items() if dtypes == (pb.D_TYPE_FLOAT32,)]
# "field: expected X, got Y" (service/errors.py InvalidInput), gRPC core's size error, or NOT_FOUND.
EXPECTED_AND_GOT = re.compile(r"^[\w.]+: expected .+, got ", re.DOTALL)
FUZZ = settings(
    derandomize=True,
    phases=(Phase.generate,),  # no shrinking: it would replay thousands of calls
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _base_step() -> pb.StepRequest:
    # Fixed, like the fuzz's own draws (derandomize=True): a failing message replays as it was.
    rng = np.random.default_rng(0)
    rollout = random_rollout(rng)
    while not rollout.truncated.any():
        rollout = random_rollout(rng)
    return step_request(rollout)


BASE_STEP = _base_step()
BASE_OBS = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)


@dataclass
class Tally:
    """Status histogram of every fuzzed call and the failures seen."""

    codes: Counter[str] = field(default_factory=Counter)
    by_method: Counter[str] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return sum(self.codes.values())


@dataclass
class Fuzzed:
    server: ServerProcess
    stub: pb_grpc.TrainerServiceStub
    digest: str
    tally: Tally
    pending: list[tuple[str, object, grpc.Future]] = field(default_factory=list)


def digest_of(stub: pb_grpc.TrainerServiceStub) -> str:
    return stub.GetStatus(pb.GetStatusRequest(), timeout=30).param_digest


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    # Control RPCs admitted BATCH at a time (the default bound, 16, would refuse some of the
    # fuzz's concurrent Restores RESOURCE_EXHAUSTED: admission, tested in test_storm.py)
    settings = ("checkpoint.keep_last=3", f"server.max_control_rpcs={BATCH}")
    with running_server(tmp, *settings) as server:
        channel = grpc.insecure_channel(server.target)
        stub = pb_grpc.TrainerServiceStub(channel)
        tally = Tally()
        yield Fuzzed(server, stub, digest_of(stub), tally)
        channel.close()


def send(fuzzed: Fuzzed, method: str, requests: list[object]) -> None:
    """Send `requests` concurrently on `method` and check every answer."""
    rpc: Callable[..., grpc.Future] = getattr(fuzzed.stub, method).future
    fuzzed.pending = [(method, request, rpc(request, timeout=60)) for request in requests]
    check(fuzzed)


def check(fuzzed: Fuzzed) -> None:
    """Wait for the pending calls; tally their codes and check each error text."""
    pending, fuzzed.pending = fuzzed.pending, []
    for method, request, call in pending:
        try:
            call.result()
            code, details = Code.OK, ""
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""
        fuzzed.tally.codes[code.name] += 1
        fuzzed.tally.by_method[f"{method} {code.name}"] += 1
        if code not in ALLOWED or not says_expected_and_got(code, details, request):
            fuzzed.tally.bad.append(f"{method} -> {code.name}: {details[:300]!r}")
    assert fuzzed.server.proc.poll() is None, fuzzed.server.stderr()[-3000:]
    assert not fuzzed.tally.bad, fuzzed.tally.bad[:10]


def says_expected_and_got(code: Code, details: str, request: object) -> bool:
    if code == Code.OK:
        return True
    if code == Code.INVALID_ARGUMENT:
        return EXPECTED_AND_GOT.match(details) is not None
    if code == Code.NOT_FOUND:  # "no checkpoint named 'x' in DIR": the name it looked for
        return isinstance(request, pb.RestoreRequest) and repr(request.name) in details
    return bool(details)


# ------------------------------------------------------------------------------ strategies
dims = st.one_of(
    st.integers(0, 12),
    st.integers(-(2**63), -1),
    st.integers(2**31, 2**63 - 1),
    st.sampled_from([2**62, 2**63 - 1, 2**32 + 1]),
)
dtype_codes = st.one_of(st.sampled_from(list(pb.DType.values())), st.integers(-(2**31), 2**31 - 1))
nonfinite = st.sampled_from([np.nan, np.inf, -np.inf])
Mutation = Callable[[pb.StepRequest], None]


@st.composite
def tensor_mutation(draw: st.DrawFn) -> Callable[[pb.Tensor], None]:
    """A change to one Tensor: a dimension, the rank, the dtype, the byte length or a value."""
    kind = draw(st.sampled_from(["dim", "rank", "dtype", "bytes", "nonfinite", "many dims"]))
    if kind == "dim":
        index, value = draw(st.integers(0, 3)), draw(dims)

        def mutate(t: pb.Tensor) -> None:
            if t.shape:
                t.shape[index % len(t.shape)] = value

    elif kind == "rank":
        extra = draw(st.lists(dims, max_size=3))
        drop = draw(st.integers(0, 2))

        def mutate(t: pb.Tensor) -> None:
            del t.shape[len(t.shape) - min(drop, len(t.shape)) :]
            t.shape.extend(extra)

    elif kind == "many dims":
        count, dim = draw(st.integers(33, 300)), draw(st.sampled_from([0, 1]))

        def mutate(t: pb.Tensor) -> None:
            t.shape.extend([dim] * count)

    elif kind == "dtype":
        code = draw(dtype_codes)

        def mutate(t: pb.Tensor) -> None:
            t.dtype = code

    elif kind == "bytes":
        delta = draw(st.integers(-64, 64).filter(bool))

        def mutate(t: pb.Tensor) -> None:
            t.data = t.data[:delta] if delta < 0 else t.data + bytes(range(delta))

    else:
        value, position = draw(nonfinite), draw(st.integers(0, 1000))

        def mutate(t: pb.Tensor) -> None:
            values = np.frombuffer(t.data[: len(t.data) // 4 * 4], "<f4").copy()
            if values.size:
                values[position % values.size] = value
                t.data = values.tobytes() + t.data[values.size * 4 :]

    return mutate


@st.composite
def step_mutation(draw: st.DrawFn) -> Mutation:
    """One random change to a StepRequest (it may or may not make it invalid)."""
    kind = draw(st.sampled_from(["tensor", "clear", "version", "actions"]))
    name = draw(st.sampled_from(list(STEP_FIELDS)))
    if kind == "tensor":
        change = draw(tensor_mutation())
        return lambda q: change(getattr(q, name))
    if kind == "clear":
        return lambda q: q.ClearField(name)
    if kind == "version":
        version = draw(st.integers(-(2**63), 2**63 - 1))
        return lambda q: setattr(q, "policy_version", version)
    action = draw(st.integers(-(2**31), 2**31 - 1))

    def mutate(q: pb.StepRequest) -> None:
        values = np.frombuffer(BASE_STEP.actions.data, "<i4").copy()
        values[0] = action
        q.actions.CopyFrom(encode(values.reshape(list(BASE_STEP.actions.shape))))

    return mutate


@st.composite
def invalidating(draw: st.DrawFn) -> Mutation:
    """A change that makes any StepRequest invalid, applied last: no fuzzed Step is applied."""
    kind = draw(st.sampled_from(["clear", "bytes", "dtype", "nonfinite"]))
    if kind == "clear":
        name = draw(st.sampled_from(REQUIRED))
        return lambda q: q.ClearField(name)
    if kind == "bytes":  # len(data) != prod(shape) * itemsize, whatever the shape
        name, extra = draw(st.sampled_from(REQUIRED)), draw(st.integers(1, 7))

        def mutate(q: pb.StepRequest) -> None:
            t = getattr(q, name)
            size = 1
            for dim in t.shape:
                size *= dim
            itemsize = {1: 4, 2: 8, 3: 4, 4: 8, 5: 1, 6: 1}.get(t.dtype, 1)
            if 0 <= size * itemsize < 2**20:
                t.data = bytes(size * itemsize + extra)
            else:
                t.data = b"\0" * extra

        return mutate
    if kind == "dtype":
        name = draw(st.sampled_from(REQUIRED))
        wrong = [c for c in pb.DType.values() if c not in STEP_FIELDS[name][0]]
        code = draw(st.one_of(st.sampled_from(wrong), st.integers(7, 2**31 - 1)))
        return lambda q: setattr(getattr(q, name), "dtype", code)
    name, value = draw(st.sampled_from(FLOAT_FIELDS[:3])), draw(nonfinite)

    def poison(q: pb.StepRequest) -> None:
        base = np.frombuffer(getattr(BASE_STEP, name).data, "<f4").copy()
        base[-1] = value
        getattr(q, name).CopyFrom(getattr(BASE_STEP, name))
        getattr(q, name).data = base.tobytes()

    return poison


@st.composite
def bad_step(draw: st.DrawFn) -> pb.StepRequest:
    request = pb.StepRequest()
    request.CopyFrom(BASE_STEP)
    for mutate in [*draw(st.lists(step_mutation(), max_size=3)), draw(invalidating())]:
        mutate(request)
    return request


@st.composite
def act(draw: st.DrawFn) -> pb.ActRequest:
    request = pb.ActRequest(obs=encode(BASE_OBS))
    for change in draw(st.lists(tensor_mutation(), max_size=2)):
        change(request.obs)
    if draw(st.integers(0, 19)) == 0:
        request.ClearField("obs")
    request.mode = draw(st.one_of(st.integers(0, 4), st.integers(-(2**31), 2**31 - 1)))
    request.epsilon = draw(
        st.one_of(st.floats(0, 1), st.floats(width=32), st.sampled_from([np.nan, np.inf]))
    )
    return request


names = st.one_of(
    st.just(""),
    st.just("x" * 10_000),
    st.text(max_size=200),
    st.text(alphabet="./\\~\0 \t\n-_aZ9", max_size=40),
    st.sampled_from(["..", "../etc", "a/../b", "/etc/passwd", "./a", "a/b", "~root", "a\0b"]),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,200}", fullmatch=True),
)


@st.composite
def name_call(draw: st.DrawFn) -> tuple[str, object]:
    name = draw(names)
    if draw(st.booleans()):
        return "Checkpoint", pb.CheckpointRequest(name=name)
    return "Restore", pb.RestoreRequest(name=name)


# ------------------------------------------------------------------------------ campaigns
@settings(FUZZ, max_examples=STEP_EXAMPLES)
@given(requests=st.lists(bad_step(), min_size=BATCH, max_size=BATCH))
def fuzz_steps(fuzzed: Fuzzed, requests: list[pb.StepRequest]) -> None:
    send(fuzzed, "Step", list(requests))


@settings(FUZZ, max_examples=ACT_EXAMPLES)
@given(requests=st.lists(act(), min_size=BATCH, max_size=BATCH))
def fuzz_acts(fuzzed: Fuzzed, requests: list[pb.ActRequest]) -> None:
    send(fuzzed, "Act", list(requests))


@settings(FUZZ, max_examples=NAME_EXAMPLES)
@given(calls=st.lists(name_call(), min_size=BATCH, max_size=BATCH))
def fuzz_checkpoint_names(fuzzed: Fuzzed, calls: list[tuple[str, object]]) -> None:
    for method in ("Checkpoint", "Restore"):
        requests = [request for name, request in calls if name == method]
        if requests:
            send(fuzzed, method, requests)


# ------------------------------------------------------------------------------ the test
@pytest.mark.slow
def test_fuzzing_the_surface_changes_nothing(fuzzed: Fuzzed) -> None:
    """>= 10,000 calls, each answered as ALLOWED with an error naming what was expected; no
    fuzzed Step applied, the parameter digest unchanged. One test for the three campaigns, so
    the count is the module's whatever way pytest-xdist spreads tests over its workers (it ran
    this module's tests on two workers at once, a group mark notwithstanding: 3,000 calls)."""
    fuzz_steps(fuzzed)
    fuzz_acts(fuzzed)
    fuzz_checkpoint_names(fuzzed)
    check(fuzzed)
    tally = fuzzed.tally
    print(f"\nfuzz status histogram over {tally.sent} calls: {dict(tally.codes)}")
    print(f"by method: {dict(sorted(tally.by_method.items()))}")
    assert tally.sent >= 10_000, tally.codes
    assert tally.by_method["Step OK"] == 0
    # Long names once came back RESOURCE_EXHAUSTED (error text over the 8 KiB metadata limit).
    assert not any(k.endswith("RESOURCE_EXHAUSTED") for k in tally.by_method), tally.by_method
    assert not {"UNKNOWN", "INTERNAL"} & set(tally.codes), tally.codes
    assert digest_of(fuzzed.stub) == fuzzed.digest
