"""A job's progress: on a terminal a tqdm bar (units done, units/s, elapsed time and ETA, the
latest numbers beside it) with log lines printed above it; anywhere else (a file, a pipe, CI)
the log lines alone, so a log holds no carriage returns. Training counts Steps; an evaluation
counts the episodes its policies play (`Phases`: a line as each policy finishes, with the
time so far and an estimate of the time left, so a log shows it moving too).

`Episodes` tallies the episodes that ended between two log lines, so a line reports all of
them, not only the last Step's."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Progress of a job of `total` units (Steps by default) of which `done` ran before (a
    resumed job)."""

    def __init__(
        self, total: int, done: int = 0, stream: TextIO | None = None, unit: str = "Step"
    ) -> None:
        self.stream = stream or sys.stdout
        self.bar = tqdm(
            total=total,
            initial=done,
            unit=unit,
            file=self.stream,
            disable=not self.stream.isatty(),
            dynamic_ncols=True,
        )

    @property
    def on_terminal(self) -> bool:
        """Whether the bar shows (else only the log lines do)."""
        return not self.bar.disable

    def step(self, status: str, count: int = 1) -> None:
        """`count` units ran; `status`: their numbers, shown beside the bar."""
        self.bar.set_postfix_str(status, refresh=False)
        self.bar.update(count)

    def log(self, line: str) -> None:
        """A log line, above the bar where there is one."""
        self.bar.write(line, file=self.stream)
        self.stream.flush()

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Episodes:
    """The episodes that ended since the last `take`: how many, and their returns' sum.

    >>> tally = Episodes()
    >>> tally.add(2, 10.0); tally.add(1, 2.0); tally.text()
    'episode return 4.00 (3 ended)'
    >>> tally.take(); tally.text()
    (3, 12.0)
    'no episode ended'
    """

    def __init__(self) -> None:
        self.count, self.total = 0, 0.0

    def add(self, count: int, total: float) -> None:
        """`count` more episodes ended, their returns summing to `total`."""
        self.count += count
        self.total += total

    def text(self) -> str:
        """Their mean return and count, or that none ended."""
        if not self.count:
            return "no episode ended"
        return f"episode return {self.total / self.count:.2f} ({self.count} ended)"

    def take(self) -> tuple[int, float]:
        """(count, return sum) so far; the tally starts again at zero."""
        taken = self.count, self.total
        self.count, self.total = 0, 0.0
        return taken


class Phases:
    """Progress over `total` units done in `phases` named parts (an evaluation: `total`
    episodes, one part per policy): the bar moves with `advance`; `end` prints a line per part,
    on a terminal or not: "LABEL k/phases: WHAT (n/total units, s s, about s s left)". The
    estimate assumes the units left take as long each as those done."""

    def __init__(self, label: str, total: int, phases: int, unit: str = "episode",
                 stream: TextIO | None = None) -> None:  # fmt: skip
        self.label, self.total, self.phases, self.unit = label, total, phases, unit
        self.progress = Progress(total, stream=stream, unit=unit)
        self.done, self.ended = 0, 0
        self.started = time.perf_counter()

    def advance(self, count: int) -> None:
        """`count` more units done."""
        if count:
            self.done += count
            self.progress.step(f"{self.ended}/{self.phases} done", count)

    def end(self, what: str, units: int | None = None) -> None:
        """A part ended: `what` it did; `units`: the total done by now where the part did
        fewer than it was counted for (the bar catches up)."""
        if units is not None:
            self.advance(units - self.done)
        self.ended += 1
        spent = time.perf_counter() - self.started
        left = spent / self.done * (self.total - self.done) if self.done else 0.0
        self.progress.log(f"{self.label} {self.ended}/{self.phases}: {what} ({self.done}/"
                          f"{self.total} {self.unit}s, {spent:.1f} s, about {left:.0f} s "
                          "left)")  # fmt: skip

    def close(self) -> None:
        self.progress.close()

    def __enter__(self) -> Phases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
