"""Which keyed Steps a trainer has applied, with their results: what makes a retried Step safe.

A client names each Step with an idempotency key: its actor id and a sequence number. The
ledger keeps the newest `capacity` keys with the result each one's Step produced and the digest
of its content (`Rollout.digest`), so a Step sent again (its reply was lost) is answered with
that result instead of being applied twice, and a Step of other content under a known key (an
actor id used twice, a client's bug) is refused instead of answered with another Step's result.
For every actor it also remembers the highest sequence number it has let go of: a key at or
below it is refused as forgotten, because the ledger cannot tell any more whether it was
applied. The ledger travels in checkpoints beside the trainer's state, so after a restart from
a checkpoint it holds exactly the keys whose Steps that state includes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from service.errors import ForgottenStepKey, InvalidInput, KeyReused
from service.types import StepResult

ACTOR_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}")
ACTOR_ID_RULE = "1-128 characters from [A-Za-z0-9._:@/-], starting with a letter or digit"
MAX_SEQUENCE = 2**63 - 1
# In a refusal of a rollout for its policy version: newer than the server's state (a Restore
# took it back, or the rollout is another server's), not older than train.max_policy_lag allows.
AHEAD = "ahead of the server's state"


@dataclass(frozen=True, order=True)
class StepKey:
    actor: str
    sequence: int

    @classmethod
    def checked(cls, actor: object, sequence: object) -> StepKey:
        """A key from a request's fields, or InvalidInput naming the field that is wrong."""
        if not isinstance(actor, str) or ACTOR_ID.fullmatch(actor) is None:
            raise InvalidInput("idempotency_key.actor_id", ACTOR_ID_RULE, repr(actor))
        if type(sequence) is not int or not 0 <= sequence <= MAX_SEQUENCE:
            raise InvalidInput("idempotency_key.sequence", f"an integer in [0, {MAX_SEQUENCE}]",
                               repr(sequence))  # fmt: skip
        return cls(actor, sequence)

    def __str__(self) -> str:
        return f"{self.actor}#{self.sequence}"


class StepLedger:
    """The newest `capacity` applied keys with their results, oldest first. Not thread-safe:
    its owner serialises access (the server's Learner holds its lock)."""

    def __init__(self, capacity: int) -> None:
        if type(capacity) is not int or capacity < 1:
            raise InvalidInput("capacity", "an integer >= 1", repr(capacity))
        self.capacity = capacity
        self._results: OrderedDict[StepKey, StepResult] = OrderedDict()
        self._digests: dict[StepKey, str | None] = {}  # None: recorded without (an old ledger)
        self._forgotten: dict[str, int] = {}  # actor -> highest sequence let go of

    def __len__(self) -> int:
        return len(self._results)

    def applied_keys(self) -> list[StepKey]:
        """The remembered keys, oldest first."""
        return list(self._results)

    def lookup(self, key: StepKey, digest: Callable[[], str]) -> StepResult | None:
        """The result of `key`'s Step if it was applied, None if it was not; ForgottenStepKey
        when the key is too old for the ledger to tell, KeyReused when `digest()` (the content
        now sent under it, computed only here) differs from the applied Step's."""
        found = self._results.get(key)
        if found is not None:
            check_same_content(key, self._digests.get(key), digest)
            return copy.deepcopy(found)  # the caller's to change (replayed, timings)
        forgotten = self._forgotten.get(key.actor)
        if forgotten is not None and key.sequence <= forgotten:
            raise ForgottenStepKey(
                f"idempotency_key: {key} is at or below sequence {forgotten}, which this "
                f"server's ledger of the newest {self.capacity} keys (server.step_key_window) "
                "has let go of, so it cannot tell whether that Step was applied; use a new "
                "sequence number"
            )
        return None

    def record(self, key: StepKey, result: StepResult, digest: str | None) -> None:
        """Remember that `key`'s Step, of content `digest`, was applied with `result`; let go of
        the oldest keys."""
        self._results[key] = copy.deepcopy(result)  # the Learner adds to its dicts after
        self._digests[key] = digest
        self._let_go()

    def _let_go(self) -> None:
        """Drop the oldest keys beyond the capacity, remembering each actor's highest."""
        while len(self._results) > self.capacity:
            old, _ = self._results.popitem(last=False)
            del self._digests[old]
            self._forgotten[old.actor] = max(self._forgotten.get(old.actor, -1), old.sequence)

    def adopt(self, other: StepLedger) -> None:
        """Hold `other`'s keys and results instead of this ledger's (a restore)."""
        self._results = OrderedDict(other._results)
        self._digests = dict(other._digests)
        self._forgotten = dict(other._forgotten)
        self._let_go()

    # ------------------------------------------------------------------------ persistence
    def to_json(self) -> bytes:
        body = {
            "capacity": self.capacity,
            "applied": [
                {"actor": key.actor, "sequence": key.sequence, "result": dataclasses.asdict(r),
                 "digest": self._digests[key]}
                for key, r in self._results.items()
            ],
            "forgotten": dict(sorted(self._forgotten.items())),
        }
        return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, capacity: int) -> StepLedger:
        """The ledger saved as `data`, kept to this server's `capacity` (its oldest keys are
        let go of when the saved ledger holds more). ValueError on malformed data."""
        body = json.loads(data)
        ledger = cls(capacity)
        ledger._forgotten = {str(actor): int(seq) for actor, seq in body["forgotten"].items()}
        for entry in body["applied"]:
            key = StepKey.checked(entry["actor"], entry["sequence"])
            digest = entry.get("digest")  # a ledger saved before digests has none
            if digest is not None and not isinstance(digest, str):
                raise ValueError(f"digest of {key}: expected a hex string, got {digest!r}")
            ledger.record(key, StepResult(**entry["result"]), digest)
        return ledger


def check_same_content(key: StepKey, held: str | None, digest: Callable[[], str]) -> None:
    """KeyReused unless `digest()` (computed only when there is one to compare with) equals
    `held`, the digest of the Step the server holds under `key`."""
    if held is None:
        return
    sent = digest()
    if sent != held:
        raise KeyReused(
            f"idempotency_key: {key} names a Step of other content (sha256 {held[:12]}..., "
            f"sent {sent[:12]}...); a new Step needs a new sequence number, and two actors need "
            "two actor ids"
        )
