"""The learner, which only learns: it owns the trainer, consumes the Step queue, keeps the ledger
of applied Steps' keys, applies each Step and publishes its parameters to the Act snapshot.
When to checkpoint is the Checkpointer's (`after_step`, server.checkpointer), what GetStatus
says is server.get_status's, and acting is server.acting's.

The learner's Step is the learner's (`StepQueue`): the rollouts of Interact streams are trained
side by side, whole, in Steps of at least train.num_envs columns; a Step applies its rollouts'
keys together or not at all, and each key's reply names the Step that applied it. A keyed Step
is looked up in the ledger first (and joins the same key's Step while that one is queued), so a
Step sent again is answered, never applied twice; the ledger changes only with the trainer,
under `lock`, and a checkpoint saves and restores it with the state. A rollout the learner
will not train on (too old, ahead of a restored state, its caller gone, a reused or forgotten
key, a drain's grace run out) is counted by reason in trident_rollouts_dropped_total.

Whoever reads or writes the live trainer (a Step, a checkpoint, a Restore, a setting, a status)
holds `lock`; the ledger and the keys queued have a lock of their own, taken inside it, so that
a Step sent again is answered while another Step runs. Nothing here knows gRPC.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import threading
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TypeVar

from service import logs
from service.errors import Abandoned, ForgottenStepKey, KeyReused, StalePolicy, Unavailable
from service.server.acting import Acting
from service.server.get_status import RecentSteps
from service.server.metrics import Metrics
from service.server.status import drop_reason
from service.server.step_log import StepSummary
from service.server.step_queue import Seat, StepQueue, Taken
from service.step_ledger import AHEAD, StepKey, StepLedger, check_same_content
from service.trainer import schedule
from service.trainer.trainer import Trainer
from service.types import CheckpointInfo, Rollout, StepResult

DIGEST_THREADS = 2  # keyed Steps hashed at once, off the Step worker
T = TypeVar("T")


@dataclass(frozen=True)
class _Work:
    rollout: Rollout
    key: StepKey | None
    digest: Future[str] | None  # of a keyed Step's content, computed beside the queue


@dataclass
class _Queued:
    """A keyed Step in the queue and the callers waiting on it: the first, then any retries."""

    future: Future[StepResult]
    waiting: list[Callable[[], bool]]
    digest: Future[str]

    def anyone_waiting(self) -> bool:
        return any(waiting() for waiting in self.waiting)


@dataclass(frozen=True)
class StreamSeat:
    """An Interact stream's place at the learner (`learner_api.StreamSeat`): its rollouts are
    keyed Steps trained side by side with other streams' in the learner's Step."""

    learner: Learner
    seat: Seat

    def submit(
        self, rollout: Rollout, caller_waiting: Callable[[], bool], key: StepKey
    ) -> Future[StepResult]:
        return self.learner.submit_step(rollout, caller_waiting, key, self.seat)

    def waiting(self) -> AbstractContextManager[None]:
        return self.seat.waiting()

    def close(self) -> None:
        self.seat.close()


class Learner:
    """Applies Steps to `trainer`, publishing each to `acting`'s snapshot.

    `clock` is the monotonic clock (seconds) behind the Step duration metrics and the Step
    queue's waits; a simulation or a test can pass its own.
    """

    def __init__(
        self, trainer: Trainer, metrics: Metrics, acting: Acting, clock: Callable[[], float]
    ) -> None:
        self.trainer, self.metrics, self.acting, self.clock = trainer, metrics, acting, clock
        self.lock = threading.Lock()  # the live trainer
        server = trainer.config.server
        self.ledger = StepLedger(server.step_key_window)
        self._keys_lock = threading.RLock()  # the ledger and _queued; taken inside `lock`
        self._queued: dict[StepKey, _Queued] = {}
        # The global step of the newest checkpoint saved or restored (0: none), which every
        # reply reports so that a client knows which of its Steps a checkpoint holds; the
        # Checkpointer sets it
        self.checkpoint_step = 0
        # Called under `lock` after each Step that trained, before its replies go out: the
        # Checkpointer's clock hangs here
        self.after_step: Callable[[StepResult], None] = lambda result: None
        # The furthest step a Restore took this state back from (0: none did): a rollout ahead
        # of the state is said to come from before a rollback only when one is known.
        self._went_back_from = 0
        # optim.lr as set (the config's, or UpdateHyperparams'): train.lr_schedule scales it
        # before each Step; a Restore's settings bring the rate of their Step, not this
        self._base_lr = trainer.config.optim.lr
        self.state_epoch = secrets.randbits(62)  # new whenever the state is replaced
        self._steps: StepQueue[_Work] = StepQueue(
            self._apply_steps,
            server.step_queue_size,
            server.step_max_wait_ms / 1e3,
            lambda: self.trainer.config.train.num_envs,
            clock,
        )
        # Keyed Steps' content digests (Rollout.digest), hashed off the Step worker: sha256 lets
        # the GIL go, so a large Step costs the worker no wait for its hashing.
        self._digests = ThreadPoolExecutor(DIGEST_THREADS, thread_name_prefix="trident-digest")
        self.recent = RecentSteps()  # GetStatus's rate and the newest Step's age
        # The log's Steps: each at DEBUG, a summary at INFO (the Step worker's alone)
        self._summary = StepSummary(lambda: self.trainer.config.train.log_every, clock)

    # ------------------------------------------------------------------------ rollouts in
    def submit_step(
        self,
        rollout: Rollout,
        caller_waiting: Callable[[], bool],
        key: StepKey | None = None,
        seat: Seat | None = None,
        client: Hashable = None,
    ) -> Future[StepResult]:
        """Queue a validated rollout. A request's (`client`'s, or its key's actor's) is a Step
        of its own, or joins the streams' Step while streams of its layout are producing, and a
        full queue raises QueueFull (RESOURCE_EXHAUSTED) at once; an Interact stream's (its
        `seat`) is trained side by side with other streams' rollouts, and a full queue is
        waited out. A `key` applied before is answered with its
        result (`replayed`), one still queued is joined; ForgottenStepKey when the key is older
        than the ledger remembers, KeyReused when it names other content, StalePolicy when its
        policy version is outside the lag the learner takes (checked again when its Step
        starts), so a rollout the learner would refuse never waits in the queue."""
        try:
            future = self._queue_step(rollout, caller_waiting, key, seat, client)
        except (KeyReused, ForgottenStepKey, StalePolicy, Abandoned) as refused:
            self.metrics.rollouts.inc()
            self._dropped(refused)
            raise
        self.metrics.step_queue_depth.set(self._steps.depth)
        return future

    def open_seat(self, columns: int) -> StreamSeat:
        """An Interact stream's place at the Step queue (`StepQueue.open_seat`)."""
        return StreamSeat(self, self._steps.open_seat(columns))

    @property
    def queue_depth(self) -> int:
        """Rollouts and requests' Steps waiting to be applied."""
        return self._steps.depth

    @property
    def open_streams(self) -> int:
        """Interact streams holding a seat now."""
        return self._steps.open_streams

    def _queue_step(
        self,
        rollout: Rollout,
        caller_waiting: Callable[[], bool],
        key: StepKey | None,
        seat: Seat | None,
        client: Hashable,
    ) -> Future[StepResult]:
        columns, layout = rollout.num_envs, rollout.layout
        if seat is not None:  # outside the keys' lock: the Step worker takes it
            self._steps.wait_for_room(seat, columns, layout, caller_waiting)
            client = seat
        elif key is not None:
            client = key.actor
        if key is None:
            self._check_lag(rollout.policy_version)
            future = self._steps.submit(_Work(rollout, None, None), caller_waiting, columns,
                                        client, layout, must_fit=seat is None)  # fmt: skip
            self._received(future)
            return future
        with self._keys_lock:
            applied = self.ledger.lookup(key, rollout.digest)
            if applied is not None:
                applied.replayed, applied.checkpoint_step = True, self.checkpoint_step
                applied.state_epoch = self.state_epoch
                self.metrics.steps_replayed.inc()
                future = Future()
                future.set_result(applied)
                return future
            queued = self._queued.get(key)
            if queued is not None:
                check_same_content(key, queued.digest.result(), rollout.digest)
                queued.waiting.append(caller_waiting)
                self.metrics.steps_replayed.inc()
                return queued.future
            self._check_lag(rollout.policy_version)
            try:
                digest = self._digests.submit(rollout.digest)
            except RuntimeError:  # shut down by a drain: the queue is closed too
                raise Unavailable("the server is draining and takes no new Steps") from None
            queued = _Queued(Future(), [caller_waiting], digest)
            work = _Work(rollout, key, digest)
            queued.future = self._steps.submit(work, queued.anyone_waiting, columns, client,
                                               layout, must_fit=seat is None)  # fmt: skip
            self._queued[key] = queued
        queued.future.add_done_callback(lambda _: self._unqueue(key))
        self._received(queued.future)
        return queued.future

    def _received(self, future: Future[StepResult]) -> None:
        """Count a rollout the learner was handed, and its drop if it is refused."""
        self.metrics.rollouts.inc()
        future.add_done_callback(lambda done: self._dropped(done.exception()))

    def _dropped(self, error: BaseException | None) -> None:
        reason = None if error is None else drop_reason(error)
        if reason is not None:
            self.metrics.rollouts_dropped.labels(reason=reason).inc()

    def _unqueue(self, key: StepKey) -> None:
        with self._keys_lock:
            self._queued.pop(key, None)

    def _check_lag(self, version: int | None) -> None:
        """FAILED_PRECONDITION for a rollout too many versions old, or from a version this
        state has not reached: acted on before a Restore took the state back, or by a policy
        this server never held (another server's, or a state lost in a restart)."""
        if version is None:
            return
        current, limit = self.trainer.global_step, self.trainer.config.train.max_policy_lag
        if not current - limit <= version <= current:
            if version <= current:
                why = "older than the lag allows"
            elif version <= self._went_back_from:
                why = (f"{AHEAD} (at step {current}): a Restore took it back from step "
                       f"{self._went_back_from} to an earlier checkpoint")  # fmt: skip
            else:
                why = (f"{AHEAD} (at step {current}): newer than any step this state reached, "
                       "so from another server or from a state it went back from")  # fmt: skip
            raise StalePolicy(
                f"policy_version: expected a version in [{max(current - limit, 0)}, {current}] "
                f"(train.max_policy_lag = {limit}), got {version}: {why}"
            )

    # ------------------------------------------------------------------------ the Step
    def _apply_steps(self, taken: Taken[_Work]) -> list[StepResult | Exception]:
        """One Step on the taken rollouts side by side: each one refused for its policy
        version (or a failed digest) is left out; the rest train together and their keys are
        recorded together, each with its own copy of the Step's result."""
        started = self.clock()
        outcomes: dict[int, StepResult | Exception] = {}  # by the rollout's place in `taken`
        trained: list[tuple[int, _Work, str | None]] = []
        with self.lock:
            before = self.trainer.global_step
            for index, (work, _) in enumerate(taken):
                try:
                    self._check_lag(work.rollout.policy_version)
                    # Hashed meanwhile, it is done by now; a failure applies nothing of it.
                    digest = None if work.digest is None else work.digest.result()
                except Exception as error:
                    outcomes[index] = error
                else:
                    trained.append((index, work, digest))
            if not trained:
                return [outcomes[index] for index in range(len(taken))]
            rollout = Rollout.side_by_side([work.rollout for _, work, _ in trained],
                                           self.trainer.backend.host_empty)  # fmt: skip
            schedule.schedule_next_step(self.trainer, self._base_lr)
            # Every float a request brings is checked as it is decoded (server.validation), and
            # the log-probs of Interact's rollouts are the server's own: no second scan.
            result = self.trainer.step(rollout, finite=True)
            lr = self.trainer.config.optim.lr  # the rate this Step trained at
            warning = schedule.ended(self.trainer.config.train, result.global_step)
            result.warnings += [warning] if warning and result.updates_applied else []
            self.acting.publish()
            replies = []
            with self._keys_lock:
                for index, work, digest in trained:
                    reply = self._reply(result, work.rollout, before, taken[index][1])
                    if work.key is not None:
                        self.ledger.record(work.key, reply, digest)
                    outcomes[index] = reply
                    replies.append(reply)
            self.after_step(result)
            self.observe_rate()
            self.recent.add(started, self.clock(), rollout.horizon * rollout.num_envs)
            for reply in replies:
                reply.checkpoint_step, reply.state_epoch = self.checkpoint_step, self.state_epoch
        samples = rollout.horizon * rollout.num_envs
        self.metrics.observe_step(result, samples, self.clock() - started, len(trained))
        self.metrics.step_queue_depth.set(self._steps.depth)
        ms = round(result.timings_ms.get("total", 0), 2)
        summary = self._summary.add(result, samples, len(trained), ms, lr)
        if summary is not None:
            logs.event(logging.INFO, "steps", **summary)
        logs.event(
            logging.DEBUG,
            "step",
            global_step=result.global_step,
            samples=samples,
            rollouts=len(trained),
            keys=[str(work.key) for _, work, _ in trained if work.key is not None] or None,
            skipped=result.skip_reason or None,
            ms=ms,
        )
        for warning in result.warnings:
            logs.event(logging.WARNING, "setting", global_step=result.global_step, advice=warning)
        return [outcomes[index] for index in range(len(taken))]

    @staticmethod
    def _reply(result: StepResult, rollout: Rollout, before: int, queued_ms: float) -> StepResult:
        """One rollout's copy of its Step's result: its own policy lag and time queued."""
        lag = 0 if rollout.policy_version is None else before - rollout.policy_version
        return dataclasses.replace(
            result,
            losses=dict(result.losses),
            timings_ms={**result.timings_ms, "queue": queued_ms},
            warnings=list(result.warnings),
            policy_lag=lag,
        )

    # ------------------------------------------------------------------------ the state
    def with_state(self, use: Callable[[Trainer, StepLedger], T]) -> T:
        """`use(trainer, ledger)` with no key recorded meanwhile, so that a checkpoint holds
        the state and its Steps' keys together; the caller holds `lock`. Acts go on meanwhile
        (the state takes a copy of their counter)."""
        with self._keys_lock:
            return use(self.trainer, self.ledger)

    def replace_state(
        self, load: Callable[[Trainer, StepLedger], CheckpointInfo]
    ) -> CheckpointInfo:
        """Replace the state and the ledger with what `load` reads into them (a Restore), no
        Act running meanwhile, and publish it. A state of an earlier step is remembered (a
        rollout ahead of it is then said to come from before a rollback), and the state takes
        a new epoch. The caller holds `lock`."""
        before = self.trainer.global_step
        with self.acting.held(), self._keys_lock:
            info = load(self.trainer, self.ledger)
        if info.global_step < before:
            self._went_back_from = max(self._went_back_from, before)
        self.state_epoch = secrets.randbits(62)
        self.observe_rate()
        return info

    def update_hyperparams(self, values: Mapping[str, float]) -> str:
        """Set the trainer's hot settings; optim.lr is the base rate that train.lr_schedule
        scales before each Step. The settings as they are now, as JSON."""
        with self.lock:
            trainer, scaled = self.trainer, dict(values)
            base = scaled.get("optim.lr")
            if base is not None and base >= 0:  # else the trainer refuses it as given
                step = trainer.global_step
                scaled["optim.lr"] = schedule.learning_rate(trainer.config.train, base, step)
            trainer.update_hyperparams(scaled)
            if base is not None:
                self._base_lr = base
            self.observe_rate()
            return json.dumps(trainer.config.public_dict())

    def next_rate(self) -> float:
        """The rate the next Step trains at; the caller holds `lock`."""
        train = self.trainer.config.train
        return schedule.learning_rate(train, self._base_lr, self.trainer.global_step)

    def observe_rate(self) -> None:
        """The schedule's metrics; the caller holds `lock`."""
        self.metrics.learning_rate.set(self.next_rate())
        self.metrics.lr_schedule_steps.set(self.trainer.config.train.steps)

    # ------------------------------------------------------------------------ lifecycle
    def close(self, grace_s: float = float("inf")) -> None:
        """Apply the queued Steps that start within `grace_s` (the rest are answered
        UNAVAILABLE), take no more, and log the Steps since the last summary."""
        self._steps.close(grace_s)
        self._digests.shutdown()
        summary = self._summary.flush()  # the worker is done
        if summary is not None:
            logs.event(logging.INFO, "steps", **summary)
