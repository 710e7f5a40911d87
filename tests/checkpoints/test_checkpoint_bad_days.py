"""Checkpoints on a bad day, in process: a volume that runs out of room mid-save, and a resume
over checkpoints that do not validate (the server's and `trident train --resume`'s rule)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
from conftest import committed, edit_manifest, small_config

import service.checkpoint as checkpoint
from service.checkpoint import (
    list_checkpoints,
    resumable,
    save_checkpoint,
    survey_checkpoints,
)
from service.errors import CheckpointDiskFull, InvalidInput, NoValidCheckpoint
from service.jobs.train import checkpoint_to_resume
from service.trainer.trainer import Trainer


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_volume_out_of_room_is_disk_full_naming_what_was_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    written = []
    real_write = checkpoint._write_file

    def write_until_full(path: Path, data: bytes) -> dict[str, Any]:
        if written:  # the second file finds the volume full
            raise OSError(code, "No space left on device", str(path))
        written.append(path)
        return real_write(path, data)

    monkeypatch.setattr(checkpoint, "_write_file", write_until_full)
    with pytest.raises(CheckpointDiskFull) as full:
        save_checkpoint(Trainer(small_config()), tmp_path, "full")
    message = str(full.value)
    assert str(tmp_path) in message and "'full'" in message
    assert "bytes free there" in message and "needs" in message
    needed = int(message.split("needs ")[1].split(" bytes")[0])
    assert needed > 1000
    assert list_checkpoints(tmp_path) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # none half-written


def test_other_write_errors_are_not_disk_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(path: Path, data: bytes) -> dict[str, Any]:
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(checkpoint, "_write_file", broken)
    with pytest.raises(OSError) as failed:
        save_checkpoint(Trainer(small_config()), tmp_path, "io")
    assert not isinstance(failed.value, CheckpointDiskFull)


def test_resume_passes_over_invalid_checkpoints_naming_each(tmp_path: Path) -> None:
    assert resumable(tmp_path / "absent") == (None, [])  # nothing there: a fresh start
    committed(tmp_path, "older", "newer")
    edit_manifest(tmp_path, "newer")
    (tmp_path / "bare").mkdir()
    (tmp_path / ".tmp-crashed-1-ab").mkdir()  # a crashed save: neither valid nor invalid
    valid, invalid = survey_checkpoints(tmp_path)
    assert [c.name for c in valid] == ["older"]
    assert [i.name for i in invalid] == ["bare", "newer"]
    newest, skipped = resumable(tmp_path)
    assert newest is not None and newest.name == "older"
    assert "manifest_sha256" in skipped[1].reason and "missing" in skipped[0].reason


def test_resume_refuses_when_none_validates_unless_told(tmp_path: Path) -> None:
    committed(tmp_path, "only")
    edit_manifest(tmp_path, "only")
    with pytest.raises(NoValidCheckpoint, match=r"only: .*manifest_sha256"):
        resumable(tmp_path)
    newest, skipped = resumable(tmp_path, fresh_if_invalid=True)
    assert newest is None and [i.name for i in skipped] == ["only"]


def test_train_resume_follows_the_same_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidInput):  # no checkpoint at all: nothing to go on with
        checkpoint_to_resume(tmp_path, "latest")
    committed(tmp_path, "older", "newer")
    edit_manifest(tmp_path, "newer")
    assert checkpoint_to_resume(tmp_path, "latest") == "older"
    assert "skips checkpoint newer" in capsys.readouterr().err
    edit_manifest(tmp_path, "older")
    with pytest.raises(NoValidCheckpoint, match=r"newer.*older|older.*newer"):
        checkpoint_to_resume(tmp_path, "latest")
