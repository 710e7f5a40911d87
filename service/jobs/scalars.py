"""A job's per-Step scalars: one CSV row per Step and, with a TensorBoard directory, the same
scalars as TensorBoard events (tensorboardX, the `tensorboard` extra), tagged `train/<column>`
at the Step's number."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from service.errors import InvalidInput

Value = float | int | None  # None: no value this Step (an empty CSV cell, no event)


class ScalarLog:
    """Rows of `columns` (the first is the Step number) to `csv_path`; events to `tensorboard`
    if given. A job resumed after Step `resumed_at` keeps the file's rows up to that Step and
    appends after them: the rows a stopped run wrote past its checkpoint go, as TensorBoard
    purges its events from Step `resumed_at` + 1 on."""

    def __init__(
        self,
        csv_path: Path,
        columns: tuple[str, ...],
        resumed_at: int | None,
        tensorboard: Path | None,
    ) -> None:
        self.columns = columns
        purge = None if resumed_at is None else resumed_at + 1
        self._events = None if tensorboard is None else _event_writer(tensorboard, purge)
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        if resumed_at is not None and csv_path.exists():
            _cut_back(csv_path, resumed_at)
        self._file = csv_path.open("w" if resumed_at is None else "a", newline="")
        self._csv = csv.writer(self._file)
        if self._file.tell() == 0:
            self._csv.writerow(columns)

    def write(self, row: dict[str, Value]) -> None:
        """One Step's row; every column must be present (None where it has no value)."""
        if list(row) != list(self.columns):
            raise ValueError(f"row: expected the columns {self.columns}, got {tuple(row)}")
        self._csv.writerow(["" if v is None else _cell(v) for v in row.values()])
        self._file.flush()  # a job stopped midway keeps the Steps it ran
        if self._events is not None:
            step, *rest = row.items()
            for name, value in rest:
                if value is not None:
                    self._events.add_scalar(f"train/{name}", value, global_step=step[1])

    def close(self) -> None:
        self._file.close()
        if self._events is not None:
            self._events.close()

    def __enter__(self) -> ScalarLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cell(value: float | int) -> str:
    """An int as is, a float to 7 significant digits (float32 precision)."""
    return str(value) if isinstance(value, int) else f"{value:.7g}"


def _cut_back(csv_path: Path, last_step: int) -> None:
    """Keep the header and the rows of Steps up to `last_step` (written whole, then renamed
    over the file)."""
    with csv_path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    kept = rows[:1] + [row for row in rows[1:] if row and int(row[0]) <= last_step]
    temporary = csv_path.with_suffix(".csv.tmp")
    with temporary.open("w", newline="") as handle:
        csv.writer(handle).writerows(kept)
    os.replace(temporary, csv_path)


def _event_writer(directory: Path, purge_step: int | None) -> Any:
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise InvalidInput(
            "--tensorboard", "tensorboardX (pip install '.[tensorboard]')", "no such module"
        ) from None
    return SummaryWriter(str(directory), purge_step=purge_step)
