"""StepLedger: the applied keys with their results, bounded, refusing what it let go of, and
read back from JSON exactly (its results included)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import random_rollout

from service.errors import ForgottenStepKey, InvalidInput, KeyReused
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


def digest_of(key: StepKey) -> str:
    """A stand-in content digest per key (Rollout.digest has tests of its own)."""
    return f"{key.actor}/{key.sequence}".encode().hex()


def same(key: StepKey):  # the digest `lookup` asks for: the content sent now is the same
    return lambda: digest_of(key)


def test_lookup_answers_applied_keys_and_none_for_new_ones(rng: np.random.Generator) -> None:
    ledger = StepLedger(capacity=8)
    results = {StepKey(f"actor-{a}", s): random_result(rng) for a in range(2) for s in range(3)}
    for key, result in results.items():
        assert ledger.lookup(key, same(key)) is None
        ledger.record(key, result, digest_of(key))
    for key, result in results.items():
        assert ledger.lookup(key, same(key)) == result
    assert ledger.lookup(StepKey("actor-0", 3), same(StepKey("actor-0", 3))) is None
    assert ledger.lookup(StepKey("other", 0), same(StepKey("other", 0))) is None
    key = StepKey("actor-1", 2)
    found = ledger.lookup(key, same(key))
    assert found is not None
    found.replayed = True  # a caller's copy: the ledger's own result stays as recorded
    found.losses["q"] = 123.0
    found.timings_ms["queue"] = 4.0
    assert ledger.lookup(key, same(key)) == results[key]
    recorded = random_result(rng)
    ledger.record(StepKey("actor-2", 0), recorded, None)
    recorded.timings_ms["queue"] = 9.0  # as the engine does after recording
    found = ledger.lookup(StepKey("actor-2", 0), same(StepKey("x", 0)))  # no digest: any content
    assert found is not None and "queue" not in found.timings_ms


def test_a_known_key_with_other_content_is_refused(rng: np.random.Generator) -> None:
    """The content's digest decides: the same key with other content is KeyReused, naming the
    key; the digest is computed only when the key is found with one to compare."""
    ledger = StepLedger(capacity=4)
    key = StepKey("actor-0", 5)
    ledger.record(key, random_result(rng), digest_of(key))
    with pytest.raises(KeyReused, match=r"idempotency_key: actor-0#5 names a Step of other"):
        ledger.lookup(key, lambda: "another digest")
    asked: list[int] = []
    assert ledger.lookup(StepKey("actor-0", 6), lambda: asked.append(1) or "x") is None
    assert asked == []
    restored = StepLedger.from_json(ledger.to_json(), 4)  # the digest travels in checkpoints
    with pytest.raises(KeyReused):
        restored.lookup(key, lambda: "another digest")
    assert restored.lookup(key, same(key)) is not None


def test_keys_let_go_of_are_refused_per_actor(rng: np.random.Generator) -> None:
    ledger = StepLedger(capacity=3)
    order = [StepKey("a", 0), StepKey("b", 5), StepKey("a", 1), StepKey("a", 2), StepKey("b", 6)]
    for key in order:
        ledger.record(key, random_result(rng), digest_of(key))
    assert ledger.applied_keys() == order[-3:]
    for key in (StepKey("a", 0), StepKey("b", 5), StepKey("b", 4)):  # at or below a let-go key
        with pytest.raises(ForgottenStepKey, match=r"server\.step_key_window"):
            ledger.lookup(key, same(key))
    assert ledger.lookup(StepKey("a", 3), same(StepKey("a", 3))) is None
    assert ledger.lookup(StepKey("b", 7), same(StepKey("b", 7))) is None


def test_json_round_trip_and_a_smaller_capacity(rng: np.random.Generator) -> None:
    ledger = StepLedger(capacity=16)
    for sequence in rng.permutation(12):
        key = StepKey("actor:1@host/x", int(sequence))
        ledger.record(key, random_result(rng), digest_of(key))
    data = ledger.to_json()
    same = StepLedger.from_json(data, capacity=16)
    assert same.to_json() == data
    keys = ledger.applied_keys()
    assert [same.lookup(k, lambda k=k: digest_of(k)) for k in keys] == [
        ledger.lookup(k, lambda k=k: digest_of(k)) for k in keys]  # fmt: skip
    smaller = StepLedger.from_json(data, capacity=5)
    assert smaller.applied_keys() == ledger.applied_keys()[-5:]
    with pytest.raises(ForgottenStepKey):
        smaller.lookup(keys[0], lambda: digest_of(keys[0]))
    adopted = StepLedger(capacity=4)
    adopted.adopt(same)
    assert adopted.applied_keys() == ledger.applied_keys()[-4:] and adopted.capacity == 4


def test_a_result_with_every_field_survives_json(rng: np.random.Generator) -> None:
    result = random_result(rng)
    values = {f.name: getattr(result, f.name) for f in dataclasses.fields(StepResult)}
    assert set(values) >= {"losses", "warnings", "timings_ms", "skip_reason"}
    ledger = StepLedger(capacity=1)
    key = StepKey("a", 1)
    ledger.record(key, result, digest_of(key))
    assert StepLedger.from_json(ledger.to_json(), 1).lookup(key, same(key)) == result


@pytest.mark.parametrize(
    ("actor", "sequence", "field"),
    [("", 0, "actor_id"), ("-a", 0, "actor_id"), ("a b", 0, "actor_id"), ("x" * 129, 0, "actor_id"),
     (5, 0, "actor_id"), ("a", -1, "sequence"), ("a", 2**63, "sequence"), ("a", 1.0, "sequence"),
     ("a", True, "sequence")],
)  # fmt: skip
def test_bad_keys_name_the_field(actor: object, sequence: object, field: str) -> None:
    with pytest.raises(InvalidInput, match=f"idempotency_key.{field}"):
        StepKey.checked(actor, sequence)


def test_a_rollouts_digest_reads_its_content_not_its_dtypes(rng: np.random.Generator) -> None:
    """Equal content in other accepted dtypes hashes alike (int64 actions, bool or 0/1 flags,
    no final observations or an empty set); a change of one value, one shape or the policy
    version does not."""
    rollout = random_rollout(rng)
    while not rollout.truncated.any():  # with final observations
        rollout = random_rollout(rng)
    recast = dataclasses.replace(
        rollout,
        actions=rollout.actions.astype(np.int64),
        terminated=rollout.terminated.astype(np.uint8),
        truncated=rollout.truncated.astype(np.uint8),
        final_obs_index=rollout.final_obs_index.astype(np.int32),
    )
    assert recast.digest() == rollout.digest()
    plain = dataclasses.replace(rollout, truncated=np.zeros_like(rollout.truncated),
                                final_obs=None, final_obs_index=None)  # fmt: skip
    empty = dataclasses.replace(plain, final_obs=np.zeros((0, rollout.obs.shape[2]), np.float32),
                                final_obs_index=np.zeros(0, np.int64))  # fmt: skip
    assert empty.digest() == plain.digest() != rollout.digest()
    for name in ("obs", "rewards", "behavior_log_probs", "aux_targets", "final_obs"):
        changed = getattr(rollout, name).copy()
        changed.reshape(-1)[rng.integers(changed.size)] += 1e-3
        assert dataclasses.replace(rollout, **{name: changed}).digest() != rollout.digest(), name
    actions = rollout.actions.copy()
    actions[0, 0] = (actions[0, 0] + 1) % 9
    assert dataclasses.replace(rollout, actions=actions).digest() != rollout.digest()
    assert dataclasses.replace(rollout, policy_version=7).digest() != rollout.digest()
    assert dataclasses.replace(rollout, bce_labels=None).digest() != rollout.digest()
