"""The per-Step scalar log (service/jobs/scalars.py): CSV rows, and the same scalars as
TensorBoard events read back from the event file."""

from __future__ import annotations

import csv
import struct
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from service.errors import InvalidInput
from service.jobs.scalars import ScalarLog

COLUMNS = ("step", "loss", "episodes", "episode_return")


def read_events(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in `directory`'s event file, by tag, as (step, value) in file order.
    TFRecord framing per record: length (uint64 LE), its masked CRC-32C, an Event proto, its
    masked CRC-32C."""
    (path,) = directory.glob("events.out.tfevents.*")
    data, at = path.read_bytes(), 0
    scalars: dict[str, list[tuple[int, float]]] = defaultdict(list)
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[at + 8 : at + 12])[0] == masked_crc32c(header)
        body = data[at + 12 : at + 12 + length]
        assert struct.unpack("<I", data[at + 12 + length : at + 16 + length])[0] == (
            masked_crc32c(body)
        )
        event = event_pb2.Event.FromString(body)
        for value in event.summary.value:
            scalars[value.tag].append((event.step, value.simple_value))
        at += 16 + length
    return dict(scalars)


def random_rows(rng: np.random.Generator, first: int, count: int) -> list[dict]:
    """Rows of COLUMNS with fresh values; episode_return only where an episode ended."""
    rows = []
    for step in range(first, first + count):
        episodes = int(rng.integers(0, 2))
        rows.append({"step": step, "loss": float(rng.normal()), "episodes": episodes,
                     "episode_return": float(rng.normal()) if episodes else None})  # fmt: skip
    return rows


def test_every_csv_scalar_is_a_tensorboard_scalar(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    rows = random_rows(rng, 1, 6)
    rows[0]["episodes"], rows[0]["episode_return"] = 1, 2.5  # at least one of each kind
    rows[1]["episodes"], rows[1]["episode_return"] = 0, None
    with ScalarLog(tmp_path / "log.csv", COLUMNS, None, tmp_path / "tb") as log:
        for row in rows[:3]:
            log.write(row)
    # a job resumed after Step 3 appends to the CSV, without a second header
    with ScalarLog(tmp_path / "log.csv", COLUMNS, 3, tmp_path / "tb2") as log:
        for row in rows[3:]:
            log.write(row)
    with (tmp_path / "log.csv").open(newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in written] == [1, 2, 3, 4, 5, 6]
    for row, line in zip(rows, written, strict=True):
        assert float(line["loss"]) == pytest.approx(row["loss"], rel=1e-6)
        if row["episode_return"] is None:
            assert line["episode_return"] == ""
        else:
            assert float(line["episode_return"]) == pytest.approx(row["episode_return"], rel=1e-6)
    events = read_events(tmp_path / "tb")
    assert set(events) == {f"train/{name}" for name in COLUMNS[1:]}
    for name in COLUMNS[1:]:
        expected = [(r["step"], r[name]) for r in rows[:3] if r[name] is not None]
        got = events[f"train/{name}"]
        assert [step for step, _ in got] == [step for step, _ in expected]
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6)
    assert [s for s, _ in read_events(tmp_path / "tb2")["train/loss"]] == [4, 5, 6]


def test_a_resumed_log_cuts_back_to_its_checkpoint(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """Rows 1-5 written, the checkpoint at Step 3: resumed, the log keeps rows 1-3, takes the
    new 4-6 after them, and the new TensorBoard events purge those of Steps 4 on."""
    first, again = random_rows(rng, 1, 5), random_rows(rng, 4, 3)
    with ScalarLog(tmp_path / "log.csv", COLUMNS, None, tmp_path / "tb") as log:
        for row in first:
            log.write(row)
    with ScalarLog(tmp_path / "log.csv", COLUMNS, 3, tmp_path / "tb") as log:
        for row in again:
            log.write(row)
    with (tmp_path / "log.csv").open(newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in written] == [1, 2, 3, 4, 5, 6]
    expected = [*first[:3], *again]
    assert [float(r["loss"]) for r in written] == pytest.approx([r["loss"] for r in expected],
                                                               rel=1e-6)  # fmt: skip
    purges = []
    for path in (tmp_path / "tb").glob("events.out.tfevents.*"):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            if event.HasField("session_log"):
                purges.append((event.step, event.session_log.status))
            at += 16 + length
    assert (4, event_pb2.SessionLog.START) in purges


def test_a_row_must_have_every_column(tmp_path: Path) -> None:
    with (
        ScalarLog(tmp_path / "log.csv", COLUMNS, None, None) as log,
        pytest.raises(ValueError, match="columns"),
    ):
        log.write({"step": 1, "loss": 0.5})


def test_tensorboard_without_tensorboardx_names_the_flag_and_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # `import` raises ImportError
    with pytest.raises(InvalidInput, match=r"--tensorboard: .*\.\[tensorboard\]"):
        ScalarLog(tmp_path / "log.csv", COLUMNS, None, tmp_path / "tb")
