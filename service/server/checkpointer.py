"""The checkpoint policy around the learner (Acme's Checkpointer wraps its Learner; SEED RL
checks its checkpoint clock in the learner's outer loop):

- the clock (`after_step`, called by the Learner after each Step that trained): a checkpoint
  when the Step applied updates and checkpoint.every_steps divides its global step,
  checkpoint.every_s has passed since the newest checkpoint saved or restored (or the start),
  or it is the run's last Step (train.steps); a failed save is logged and counted, and tried
  again a period later; the Step stands;
- Checkpoint, Restore and ListCheckpoints; the start's restore, or resume of the newest valid
  checkpoint;
- the final checkpoint of a drain, of what is new since the newest checkpoint saved or
  restored: a server that trained nothing and changed no setting since then (or since a fresh
  start) commits none, so restarts leave no pile of identical checkpoints.

A checkpoint holds the state with the ledger of its Steps' keys (`Learner.with_state`). All of
it runs under the learner's lock, and so does the state kept here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from service import logs
from service.checkpoint import (
    clean_temporaries,
    list_checkpoints,
    restore_checkpoint,
    resumable,
    save_checkpoint,
)
from service.errors import CheckpointDiskFull, InvalidInput
from service.server.learner import Learner
from service.server.metrics import Metrics
from service.types import CheckpointInfo, StepResult


class Checkpointer:
    """Checkpoints `learner`'s state under checkpoint.dir; `clock` (seconds) is the learner's."""

    def __init__(self, learner: Learner, metrics: Metrics, clock: Callable[[], float]) -> None:
        self.learner, self.metrics, self.clock = learner, metrics, clock
        self.trainer = learner.trainer
        self.root = Path(self.trainer.config.checkpoint.dir)
        # The state as the newest checkpoint saved or restored holds it, its name (None: the
        # fresh start's) and when (the clock), so that a drain with nothing new commits none
        self._committed: tuple[tuple[object, ...], str | None, float]
        self._committed = (self._fingerprint(), None, clock())
        # checkpoint.every_s: the clock at the newest checkpoint saved or restored, or the start
        self._every_s = self.trainer.config.checkpoint.every_s
        self._checkpoint_at = clock()

    @property
    def newest(self) -> tuple[str | None, float]:
        """The newest checkpoint saved or restored (None: none since the start) and the clock
        when; the caller holds the learner's lock."""
        _, name, at = self._committed
        return name, at

    # ------------------------------------------------------------------------ the clock
    def after_step(self, result: StepResult) -> None:
        """checkpoint.every_steps or .every_s, or the run's last Step: a failed save is logged
        and counted, and tried again a period later; the Step stands. The caller holds the
        learner's lock."""
        every = self.trainer.config.checkpoint.every_steps
        by_steps = every and result.global_step % every == 0
        by_time = 0 < self._every_s <= self.clock() - self._checkpoint_at
        run_end = result.global_step == self.trainer.config.train.steps  # a run's last Step
        if not (result.updates_applied and (by_steps or by_time or run_end)):
            return
        name = self._default_name()
        try:
            self._save(name)
        except Exception as error:  # counted and logged by _save
            self._checkpoint_at = self.clock()
            logs.event(logging.ERROR, "periodic checkpoint failed", name=name, error=str(error))

    # ------------------------------------------------------------------------ the calls
    def checkpoint(self, name: str | None) -> CheckpointInfo:
        """Commit checkpoint `name` (None: `step-<global step>`) of the state as it is."""
        with self.learner.lock:
            return self._save(self._default_name() if name is None else name)

    def restore(self, name: str) -> tuple[CheckpointInfo, str]:
        """Replace the state (and the ledger, and the hot settings) with checkpoint `name`'s;
        the checkpoint and the digest of the parameters restored."""
        learner = self.learner
        with learner.lock:
            info = learner.replace_state(
                lambda trainer, ledger: restore_checkpoint(trainer, self.root, name, ledger=ledger)
            )
            learner.checkpoint_step, self._checkpoint_at = info.global_step, self.clock()
            self._committed = (self._fingerprint(), info.name, self.clock())
            digest = self.trainer.param_digest()
        logs.event(logging.INFO, "restore", name=info.name, step=info.global_step)
        return info, digest

    def list_checkpoints(self) -> list[CheckpointInfo]:
        return list_checkpoints(self.root)

    # ------------------------------------------------------------------------ lifecycle
    def start(self, restore: str | None, resume: bool = False) -> None:
        """Clear crashed saves' temporaries, then restore `restore` if named, or with `resume`
        the newest committed checkpoint if there is one (a restarted server carries on).
        A resume passes over checkpoints that do not validate with a warning naming each, and
        raises NoValidCheckpoint where some exist and none validates (unless
        checkpoint.fresh_if_invalid)."""
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

    def final(self) -> CheckpointInfo | None:
        """A drain's checkpoint, once the learner has closed: of what is new since the newest
        checkpoint saved or restored, or none (and a log line saying so)."""
        with self.learner.lock:
            state, newest, _ = self._committed
            if self._fingerprint() == state:
                since = "the start" if newest is None else f"checkpoint {newest}"
                logs.event(logging.INFO, "final checkpoint", name=None, newest=newest,
                           reason=f"nothing new since {since}",
                           step=self.trainer.global_step)  # fmt: skip
                return None
            name = f"final-{self.trainer.global_step:010d}-{int(time.time() * 1000)}"
            return self._save(name)

    # ------------------------------------------------------------------------ saving
    def _fingerprint(self) -> tuple[object, ...]:
        """What changes whenever training changes the state: the Steps and updates attempted
        (every Step moves the latter, applied or skipped, keyed or not) and the settings. Acts
        are left out: they move only the counter that picks later Acts' random draws. The
        caller holds the learner's lock (or constructs)."""
        counters = self.trainer.state.counters
        steps = (int(counters[name][0]) for name in ("global_step", "updates_attempted"))
        return (*steps, self.trainer.config)

    def _save(self, name: str) -> CheckpointInfo:
        """Commit a checkpoint with the ledger; the caller holds the learner's lock."""
        before = self._fingerprint()
        try:
            info = self.learner.with_state(
                lambda trainer, ledger: save_checkpoint(trainer, self.root, name, ledger=ledger)
            )
        except InvalidInput:  # the caller's name: no failure of the checkpoint volume
            raise
        except Exception as error:
            reason = "disk_full" if isinstance(error, CheckpointDiskFull) else "error"
            self.metrics.checkpoint_failures.labels(reason=reason).inc()
            logs.event(logging.ERROR, "checkpoint failed", name=name, reason=reason,
                       error=str(error))  # fmt: skip
            raise
        self.learner.checkpoint_step, self._checkpoint_at = info.global_step, self.clock()
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
