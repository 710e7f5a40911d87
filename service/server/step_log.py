"""What the server's log says of its Steps: each Step on a DEBUG line (`step`), and at INFO a
summary (`steps`) every train.log_every Steps, or every SUMMARY_S seconds where fewer came, so
that an operator reads a few lines a minute however fast the Steps go; a drain says the rest.

A summary covers the Steps since the one before: how many, the rollouts and env steps they
trained, the env steps per second over its span, those skipped, the mean and largest Step time,
each head's mean loss and the learning rate the last one trained at.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.types import StepResult

SUMMARY_S = 30.0  # the longest a summary waits for train.log_every Steps


@dataclass
class StepSummary:
    """The Steps since the last summary; `add` returns a summary's fields when one is due."""

    every: Callable[[], int]  # train.log_every, as the config has it now
    clock: Callable[[], float]  # monotonic seconds
    every_s: float = SUMMARY_S
    _since: float | None = None  # the span's start: the previous summary, or the first Step
    _steps: int = 0
    _rollouts: int = 0
    _samples: int = 0
    _skipped: int = 0
    _ms: list[float] = field(default_factory=list)
    _losses: dict[str, list[float]] = field(default_factory=dict)
    _last: StepResult | None = None
    _last_at: float = 0.0  # the clock when the newest Step counted ended
    _rate: float = 0.0

    def add(
        self, result: StepResult, samples: int, rollouts: int, ms: float, lr: float
    ) -> dict[str, Any] | None:
        """Count one Step (`samples` env steps of `rollouts` rollouts, `ms` long, trained at
        `lr`); the summary's fields when train.log_every Steps or every_s seconds have passed
        since the last one, else None."""
        now = self.clock()
        if self._since is None:
            self._since = now - ms / 1e3  # the first Step's own time counts
        self._steps += 1
        self._rollouts += rollouts
        self._samples += samples
        self._skipped += int(result.skipped)
        self._ms.append(ms)
        for head, loss in result.losses.items():
            self._losses.setdefault(head, []).append(loss)
        self._last, self._last_at, self._rate = result, now, lr
        if self._steps >= self.every() or now - self._since >= self.every_s:
            return self.flush()
        return None

    def flush(self) -> dict[str, Any] | None:
        """The summary of the Steps counted so far (None when there are none), and a new span:
        from the end of the summary before (or the first Step's start) to the newest Step's
        end, so that a drain's summary counts no idle time after it."""
        if not self._steps or self._last is None or self._since is None:
            return None
        now = self._last_at
        seconds = max(now - self._since, 1e-9)
        fields: dict[str, Any] = {
            "global_step": self._last.global_step,
            "steps": self._steps,
            "rollouts": self._rollouts,
            "env_steps": self._samples,
            "env_steps_per_s": round(self._samples / seconds, 1),
            "seconds": round(seconds, 3),
            "skipped": self._skipped,
            "ms_mean": round(sum(self._ms) / len(self._ms), 2),
            "ms_max": round(max(self._ms), 2),
            "losses": {head: round(sum(v) / len(v), 5) for head, v in self._losses.items()},
            "learning_rate": self._rate,
        }
        self._since, self._steps, self._rollouts, self._samples, self._skipped = now, 0, 0, 0, 0
        self._ms, self._losses, self._last = [], {}, None
        return fields
