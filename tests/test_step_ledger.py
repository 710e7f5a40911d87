"""StepLedger: the applied keys with their results, bounded, refusing what it let go of, and
read back from JSON exactly (its results included)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.errors import ForgottenStepKey, InvalidInput
from service.step_ledger import StepKey, StepLedger
from service.types import StepResult


def random_result(rng: np.random.Generator) -> StepResult:
    return StepResult(
        losses={head: float(rng.normal()) for head in ("q", "pi", "v", "total")},
        grad_norm=float(rng.uniform(0, 10)),
        entropy=float(rng.uniform(0, 2)),
        global_step=int(rng.integers(1, 1 << 40)),
        timings_ms={"total": float(rng.uniform(0, 5))},
        warnings=[f"warning {rng.integers(100)}"],
    )


def test_lookup_answers_applied_keys_and_none_for_new_ones(rng: np.random.Generator) -> None:
    ledger = StepLedger(capacity=8)
    results = {StepKey(f"actor-{a}", s): random_result(rng) for a in range(2) for s in range(3)}
    for key, result in results.items():
        assert ledger.lookup(key) is None
        ledger.record(key, result)
    for key, result in results.items():
        assert ledger.lookup(key) == result
    assert ledger.lookup(StepKey("actor-0", 3)) is None
    assert ledger.lookup(StepKey("other", 0)) is None
    found = ledger.lookup(StepKey("actor-1", 2))
    assert found is not None
    found.replayed = True  # a caller's copy: the ledger's own result stays as recorded
    found.losses["q"] = 123.0
    found.timings_ms["queue"] = 4.0
    assert ledger.lookup(StepKey("actor-1", 2)) == results[StepKey("actor-1", 2)]
    recorded = random_result(rng)
    ledger.record(StepKey("actor-2", 0), recorded)
    recorded.timings_ms["queue"] = 9.0  # as the engine does after recording
    assert "queue" not in ledger.lookup(StepKey("actor-2", 0)).timings_ms  # type: ignore[union-attr]


def test_keys_let_go_of_are_refused_per_actor(rng: np.random.Generator) -> None:
    ledger = StepLedger(capacity=3)
    order = [StepKey("a", 0), StepKey("b", 5), StepKey("a", 1), StepKey("a", 2), StepKey("b", 6)]
    for key in order:
        ledger.record(key, random_result(rng))
    assert ledger.applied_keys() == order[-3:]
    for key in (StepKey("a", 0), StepKey("b", 5), StepKey("b", 4)):  # at or below a let-go key
        with pytest.raises(ForgottenStepKey, match=r"server\.step_key_window"):
            ledger.lookup(key)
    assert ledger.lookup(StepKey("a", 3)) is None and ledger.lookup(StepKey("b", 7)) is None


def test_json_round_trip_and_a_smaller_capacity(rng: np.random.Generator) -> None:
    ledger = StepLedger(capacity=16)
    for sequence in rng.permutation(12):
        ledger.record(StepKey("actor:1@host/x", int(sequence)), random_result(rng))
    data = ledger.to_json()
    same = StepLedger.from_json(data, capacity=16)
    assert same.to_json() == data
    keys = ledger.applied_keys()
    assert [same.lookup(k) for k in keys] == [ledger.lookup(k) for k in keys]
    smaller = StepLedger.from_json(data, capacity=5)
    assert smaller.applied_keys() == ledger.applied_keys()[-5:]
    with pytest.raises(ForgottenStepKey):
        smaller.lookup(ledger.applied_keys()[0])
    adopted = StepLedger(capacity=4)
    adopted.adopt(same)
    assert adopted.applied_keys() == ledger.applied_keys()[-4:] and adopted.capacity == 4


def test_a_result_with_every_field_survives_json(rng: np.random.Generator) -> None:
    result = random_result(rng)
    values = {f.name: getattr(result, f.name) for f in dataclasses.fields(StepResult)}
    assert set(values) >= {"losses", "warnings", "timings_ms", "skip_reason"}
    ledger = StepLedger(capacity=1)
    ledger.record(StepKey("a", 1), result)
    assert StepLedger.from_json(ledger.to_json(), 1).lookup(StepKey("a", 1)) == result


@pytest.mark.parametrize(
    ("actor", "sequence", "field"),
    [("", 0, "actor_id"), ("-a", 0, "actor_id"), ("a b", 0, "actor_id"), ("x" * 129, 0, "actor_id"),
     (5, 0, "actor_id"), ("a", -1, "sequence"), ("a", 2**63, "sequence"), ("a", 1.0, "sequence"),
     ("a", True, "sequence")],
)  # fmt: skip
def test_bad_keys_name_the_field(actor: object, sequence: object, field: str) -> None:
    with pytest.raises(InvalidInput, match=f"idempotency_key.{field}"):
        StepKey.checked(actor, sequence)
