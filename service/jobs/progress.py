"""A training job's progress: on a terminal a tqdm bar (Steps done, Steps/s, elapsed time and
ETA, the latest numbers beside it) with log lines printed above it; anywhere else (a file, a
pipe, CI) the log lines alone, so a log holds no carriage returns."""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Progress of a job of `total` Steps of which `done` ran before (a resumed job)."""

    def __init__(self, total: int, done: int = 0, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.bar = tqdm(
            total=total,
            initial=done,
            unit="Step",
            file=self.stream,
            disable=not self.stream.isatty(),
            dynamic_ncols=True,
        )

    def step(self, status: str) -> None:
        """One Step ran; `status`: its numbers, shown beside the bar."""
        self.bar.set_postfix_str(status, refresh=False)
        self.bar.update(1)

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
