"""The data plane behind the servicer: one trainer, its Step queue, Act batching, checkpoints.

Acting never waits for learning: Act reads the trainer's published policy snapshot
(`Trainer.snapshot`, its own copy of the parameters and its own executor) under
`self._act_lock`, while what reads or writes the live trainer (Steps, checkpoints, restores,
settings, status) holds `self._lock`. After each Step and each restore the new parameters are
published to the snapshot (a device copy, under both locks, always taken in that order); the
version an Act reports is the snapshot's. A keyed Step is looked up in the ledger of applied
keys first (and joins the same key's Step while that one is queued), so a Step sent again is
answered, never applied twice; the ledger changes only with the trainer, under the lock, and
is saved and restored with it.

The learner's Step is the learner's (`StepQueue`): the rollouts of Interact streams are trained
side by side, whole, in Steps of at least train.num_envs columns; a Step applies its rollouts'
keys together or not at all, and each key's reply names the Step that applied it. A rollout the
learner will not train on (too old, ahead of a restored state, its caller gone, a reused or
forgotten key, a drain's grace run out) is counted by reason in trident_rollouts_dropped_total.
Nothing here knows gRPC.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service import logs, trident_version
from service.api.trident.v1 import trainer_pb2 as pb
from service.checkpoint import (
    CheckpointInfo,
    clean_temporaries,
    list_checkpoints,
    load_policy,
    restore_checkpoint,
    resumable,
    save_checkpoint,
)
from service.config import Config
from service.errors import (
    Abandoned,
    CheckpointDiskFull,
    ForgottenStepKey,
    InferenceOnly,
    InvalidInput,
    KeyReused,
    StalePolicy,
    Unavailable,
)
from service.server.act_batcher import ActBatcher
from service.server.metrics import Metrics
from service.server.status import drop_reason
from service.server.step_log import StepSummary
from service.server.step_queue import Seat, StepQueue, Taken
from service.step_ledger import AHEAD, StepKey, StepLedger, check_same_content
from service.trainer import schedule
from service.trainer.trainer import Trainer
from service.types import ActMode, ActResult, Rollout, StepResult

RATE_WINDOW_S = 60.0  # GetStatus's env steps per second: over the Steps of this long
DIGEST_THREADS = 2  # keyed Steps hashed at once, off the Step worker


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


class Engine:
    """Owns the trainer for the server's lifetime.

    `clock` is the monotonic clock (seconds) behind the Step and Act duration metrics and the
    Step queue's waits; a simulation or a test can pass its own.
    """

    def __init__(
        self,
        trainer: Trainer,
        metrics: Metrics,
        inference_only: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.trainer = trainer
        self.metrics = metrics
        self.inference_only = inference_only
        self.clock = clock
        self.root = Path(trainer.config.checkpoint.dir)
        self._lock = threading.Lock()  # the live trainer
        self._act_lock = threading.Lock()  # the snapshot and the act counter; after _lock
        self._policy = trainer.snapshot()
        server = trainer.config.server
        self._policy.warm_up(server.act_max_batch)  # Acts of any size meet no capture
        self.ledger = StepLedger(server.step_key_window)
        self._keys_lock = threading.RLock()  # the ledger and _queued; taken inside _lock
        self._queued: dict[StepKey, _Queued] = {}
        self._checkpoint_step = 0  # global step of the newest checkpoint saved or restored
        # The state as the newest checkpoint saved or restored holds it, its name (None: the
        # fresh start's) and when (the clock), so that a drain with nothing new commits none
        self._committed: tuple[tuple[object, ...], str | None, float]
        self._committed = (self._fingerprint(), None, clock())
        self._last_step_at: float | None = None  # the clock at the newest Step applied
        # The furthest step a Restore took this state back from (0: none did): a rollout ahead
        # of the state is said to come from before a rollback only when one is known.
        self._went_back_from = 0
        # checkpoint.every_s: the clock at the newest checkpoint saved or restored, or the start
        self._checkpoint_every_s = trainer.config.checkpoint.every_s
        self._checkpoint_at = clock()
        # optim.lr as set (the config's, or UpdateHyperparams'): train.lr_schedule scales it
        # before each Step; a Restore's settings bring the rate of their Step, not this
        self._base_lr = trainer.config.optim.lr
        self._state_epoch = secrets.randbits(62)  # new whenever the state is replaced
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
        self._acts = ActBatcher(self._act_batch, server.act_max_batch, server.act_max_wait_ms / 1e3)
        # (start, end, env steps) of each Step that ended in the last RATE_WINDOW_S (the
        # clock's), for GetStatus's rate
        self._recent: deque[tuple[float, float, int]] = deque()
        # The log's Steps: each at DEBUG, a summary at INFO (the Step worker's alone)
        self._summary = StepSummary(lambda: self.trainer.config.train.log_every, clock)
        self.metrics.device_memory.set(trainer.memory_bytes())

    @classmethod
    def for_inference(cls, config: Config, name: str, metrics: Metrics) -> Engine:
        """An Act-only engine from checkpoint `name`: the checkpoint's model and parameters, this
        server's own server, checkpoint and backend settings, and no replay to speak of."""
        saved, params = load_policy(config.checkpoint.dir, name)
        mine = config.to_dict()
        sections = {**saved.to_dict(), "server": mine["server"], "checkpoint": mine["checkpoint"]}
        sections["train"] = {**sections["train"], "backend": config.train.backend}
        sections["replay"] = {"capacity": 1, "batch_size": 1, "min_size": 1}
        trainer = Trainer(Config.from_dict(sections))
        trainer.load_params(params)
        logs.event(logging.INFO, "inference-only", checkpoint=name)
        return cls(trainer, metrics, inference_only=True)

    # ------------------------------------------------------------------------ training
    def require_training(self, what: str) -> None:
        """InferenceOnly naming `what` on an Act-only server."""
        if self.inference_only:
            raise InferenceOnly(f"{what}: this server is inference-only and answers Act alone")

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
        self.require_training("Step")
        try:
            future = self._queue_step(rollout, caller_waiting, key, seat, client)
        except (KeyReused, ForgottenStepKey, StalePolicy, Abandoned) as refused:
            self.metrics.rollouts.inc()
            self._dropped(refused)
            raise
        self.metrics.step_queue_depth.set(self._steps.depth)
        return future

    def open_seat(self, columns: int) -> Seat:
        """An Interact stream's place at the Step queue (`StepQueue.open_seat`)."""
        return self._steps.open_seat(columns)

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
                applied.replayed, applied.checkpoint_step = True, self._checkpoint_step
                applied.state_epoch = self._state_epoch
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

    def _apply_steps(self, taken: Taken[_Work]) -> list[StepResult | Exception]:
        """One Step on the taken rollouts side by side: each one refused for its policy
        version (or a failed digest) is left out; the rest train together and their keys are
        recorded together, each with its own copy of the Step's result."""
        started = self.clock()
        outcomes: dict[int, StepResult | Exception] = {}  # by the rollout's place in `taken`
        trained: list[tuple[int, _Work, str | None]] = []
        with self._lock:
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
            self._publish()
            every = self.trainer.config.checkpoint.every_steps
            replies = []
            with self._keys_lock:
                for index, work, digest in trained:
                    reply = self._reply(result, work.rollout, before, taken[index][1])
                    if work.key is not None:
                        self.ledger.record(work.key, reply, digest)
                    outcomes[index] = reply
                    replies.append(reply)
            by_steps = every and result.global_step % every == 0
            by_time = 0 < self._checkpoint_every_s <= self.clock() - self._checkpoint_at
            run_end = result.global_step == self.trainer.config.train.steps  # a run's last Step
            if result.updates_applied and (by_steps or by_time or run_end):
                self._periodic_checkpoint()
            self._observe_rate()
            self._last_step_at = self.clock()
            self._recent.append((started, self._last_step_at, rollout.horizon * rollout.num_envs))
            for reply in replies:
                reply.checkpoint_step, reply.state_epoch = self._checkpoint_step, self._state_epoch
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

    def _periodic_checkpoint(self) -> None:
        """checkpoint.every_steps or .every_s: a failed save is logged and counted, and tried
        again a period later; the Step stands."""
        name = self._default_name()
        try:
            self._save(name)
        except Exception as error:  # counted and logged by _save
            self._checkpoint_at = self.clock()
            logs.event(logging.ERROR, "periodic checkpoint failed", name=name, error=str(error))

    # ------------------------------------------------------------------------ acting
    def act(self, obs: np.ndarray, mode: ActMode, epsilon: float) -> ActResult:
        return self._acts.act(obs, mode, epsilon)

    @property
    def act_queue_depth(self) -> int:
        """Act requests waiting to join a batch: a load signal beside the Step queue's depth."""
        return self._acts.pending()

    def _act_batch(self, parts: list[np.ndarray], mode: ActMode, epsilon: float) -> ActResult:
        """One forward for the batched requests' observations (checked by the servicer)."""
        with self._act_lock:  # the timer starts once a publish in progress has let go
            started = self.clock()
            result = self._policy.act_rows(parts, mode, epsilon)
            seconds = self.clock() - started
        self.metrics.observe_act(result.actions.shape[0], seconds)
        return result

    def _publish(self) -> None:
        """Acts from now on read the live parameters as they are; the caller holds _lock."""
        with self._act_lock:
            self._policy.publish()

    # ------------------------------------------------------------------------ state
    def _fingerprint(self) -> tuple[object, ...]:
        """What changes whenever training changes the state: the Steps and updates attempted
        (every Step moves the latter, applied or skipped, keyed or not) and the settings. Acts
        are left out: they move only the counter that picks later Acts' random draws. The
        caller holds _lock (or constructs)."""
        counters = self.trainer.state.counters
        steps = (int(counters[name][0]) for name in ("global_step", "updates_attempted"))
        return (*steps, self.trainer.config)

    def _save(self, name: str) -> CheckpointInfo:
        """Commit a checkpoint with the ledger; the caller holds _lock. Acts go on meanwhile
        (the state takes a copy of their counter)."""
        before = self._fingerprint()
        try:
            with self._keys_lock:
                info = save_checkpoint(self.trainer, self.root, name, ledger=self.ledger)
        except InvalidInput:  # the caller's name: no failure of the checkpoint volume
            raise
        except Exception as error:
            reason = "disk_full" if isinstance(error, CheckpointDiskFull) else "error"
            self.metrics.checkpoint_failures.labels(reason=reason).inc()
            logs.event(logging.ERROR, "checkpoint failed", name=name, reason=reason,
                       error=str(error))  # fmt: skip
            raise
        self._checkpoint_step, self._checkpoint_at = info.global_step, self.clock()
        self._committed = (before, info.name, self.clock())
        self.metrics.observe_checkpoint(info)
        logs.event(
            logging.INFO,
            "checkpoint",
            name=info.name,
            step=info.global_step,
            bytes=info.size_bytes,
            save_ms=info.save_ms,
        )
        return info

    def _default_name(self) -> str:
        """`step-<global step>`, or with the time in ms when that name is taken (the step was
        reached before, on a line a Restore left)."""
        name = f"step-{self.trainer.global_step:010d}"
        return f"{name}-{int(time.time() * 1000)}" if (self.root / name).exists() else name

    def checkpoint(self, name: str | None) -> CheckpointInfo:
        self.require_training("Checkpoint")
        with self._lock:
            return self._save(self._default_name() if name is None else name)

    def restore(self, name: str) -> tuple[CheckpointInfo, str]:
        self.require_training("Restore")
        with self._lock:
            before = self.trainer.global_step
            with self._act_lock, self._keys_lock:
                info = restore_checkpoint(self.trainer, self.root, name, ledger=self.ledger)
                self._policy.publish()
            if info.global_step < before:
                self._went_back_from = max(self._went_back_from, before)
            self._checkpoint_step, self._checkpoint_at = info.global_step, self.clock()
            self._committed = (self._fingerprint(), info.name, self.clock())
            self._state_epoch = secrets.randbits(62)
            digest = self.trainer.param_digest()
            self._observe_rate()
        logs.event(logging.INFO, "restore", name=info.name, step=info.global_step)
        return info, digest

    def list_checkpoints(self) -> list[CheckpointInfo]:
        return list_checkpoints(self.root)

    def update_hyperparams(self, values: Mapping[str, float]) -> str:
        self.require_training("UpdateHyperparams")
        with self._lock:
            trainer, scaled = self.trainer, dict(values)
            base = scaled.get("optim.lr")
            if base is not None and base >= 0:  # else the trainer refuses it as given
                step = trainer.global_step
                scaled["optim.lr"] = schedule.learning_rate(trainer.config.train, base, step)
            trainer.update_hyperparams(scaled)
            if base is not None:
                self._base_lr = base
            self._observe_rate()
            return json.dumps(trainer.config.public_dict())

    def status(self) -> pb.GetStatusResponse:
        """GetStatus's answer: the proto's message is the one record of what a status holds."""
        with self._lock:
            trainer = self.trainer
            return pb.GetStatusResponse(
                global_step=trainer.global_step,
                backend=trainer.backend.name,
                device=trainer.backend.device,
                config_json=json.dumps(trainer.config.public_dict()),
                param_digest=trainer.param_digest(),
                inference_only=self.inference_only,
                step_queue_depth=self._steps.depth,
                replay_size=len(trainer.state.replay),
                version=trident_version(),
                kernel_abi_version=trainer.backend.kernel_abi_version,
                auth_mode=trainer.config.server.client_auth(),
                auth_token_set=bool(
                    trainer.config.server.auth_token or trainer.config.server.auth_tokens_file
                ),
                checkpoint_step=self._checkpoint_step,
                state_epoch=self._state_epoch,
                learning_rate=self._next_rate(),
                lr_schedule=schedule.where(trainer.config.train, trainer.global_step),
                **self._activity(),
            )

    def _activity(self) -> dict[str, Any]:
        """GetStatus's view of the recent work: the env steps per second of the Steps that
        ended in the last RATE_WINDOW_S (over that, or since the first of them began where
        that is sooner: a server that started training 5 s ago has a rate of 5 s), the streams
        open, the newest Step's and checkpoint's ages; the caller holds _lock."""
        now = self.clock()
        while self._recent and self._recent[0][1] < now - RATE_WINDOW_S:
            self._recent.popleft()
        span = min(RATE_WINDOW_S, now - self._recent[0][0]) if self._recent else RATE_WINDOW_S
        _, newest, committed_at = self._committed
        return {
            "env_steps_per_s": sum(samples for *_, samples in self._recent) / max(span, 1e-9),
            "open_streams": self._steps.open_streams,
            "seconds_since_step": None if self._last_step_at is None else now - self._last_step_at,
            "checkpoint_name": newest or "",
            "checkpoint_age_s": None if newest is None else now - committed_at,
        }

    def _next_rate(self) -> float:
        """The rate the next Step trains at; the caller holds _lock."""
        train = self.trainer.config.train
        return schedule.learning_rate(train, self._base_lr, self.trainer.global_step)

    def _observe_rate(self) -> None:
        """The schedule's metrics; the caller holds _lock."""
        self.metrics.learning_rate.set(self._next_rate())
        self.metrics.lr_schedule_steps.set(self.trainer.config.train.steps)

    # ------------------------------------------------------------------------ lifecycle
    def start(self, restore: str | None, resume: bool = False) -> None:
        """Clear crashed saves' temporaries, then restore `restore` if named, or with `resume`
        the newest committed checkpoint if there is one (a restarted server carries on).
        A resume passes over checkpoints that do not validate with a warning naming each, and
        raises NoValidCheckpoint where some exist and none validates (unless
        checkpoint.fresh_if_invalid)."""
        if self.inference_only:
            return
        removed = clean_temporaries(self.root) if self.root.exists() else 0
        if removed:
            logs.event(logging.WARNING, "removed uncommitted checkpoints", count=removed)
        if restore is None and resume:
            fresh_if_invalid = self.trainer.config.checkpoint.fresh_if_invalid
            newest, invalid = resumable(self.root, fresh_if_invalid)
            for skipped in invalid:  # a fallback to an older checkpoint, or a fresh start
                logs.event(logging.WARNING, "resume skipped checkpoint", name=skipped.name,
                           reason=skipped.reason,
                           instead=None if newest is None else newest.name)  # fmt: skip
            if newest is None:
                why = "none valid (checkpoint.fresh_if_invalid)" if invalid else "none committed"
                logs.event(logging.WARNING if invalid else logging.INFO, "resume",
                           checkpoint=None, reason=why)  # fmt: skip
            restore = None if newest is None else newest.name
        if restore is not None:
            self.restore(restore)
        with self._lock:
            self._observe_rate()

    def drain(self, grace_s: float = float("inf")) -> CheckpointInfo | None:
        """Finish queued Steps (those that start within `grace_s`) and Acts, then commit a
        final checkpoint (training servers) of what is new since the newest checkpoint saved
        or restored: a server that trained nothing and changed no setting since then (or since
        a fresh start) commits none, so restarts leave no pile of identical checkpoints."""
        self._steps.close(grace_s)
        self._digests.shutdown()
        self._acts.close()
        summary = self._summary.flush()  # the Steps since the last summary (the worker is done)
        if summary is not None:
            logs.event(logging.INFO, "steps", **summary)
        if self.inference_only:
            return None
        with self._lock:
            state, newest, _ = self._committed
            if self._fingerprint() == state:
                since = "the start" if newest is None else f"checkpoint {newest}"
                logs.event(logging.INFO, "final checkpoint", name=None, newest=newest,
                           reason=f"nothing new since {since}",
                           step=self.trainer.global_step)  # fmt: skip
                return None
            name = f"final-{self.trainer.global_step:010d}-{int(time.time() * 1000)}"
            return self._save(name)
