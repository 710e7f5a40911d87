"""The checkpoint volume on a bad day, against a real server.

A full volume (a 4 MiB tmpfs, filled but for a few KiB): Checkpoint answers RESOURCE_EXHAUSTED
naming the checkpoint directory, the bytes the checkpoint needed and those free;
trident_checkpoint_failures_total{reason="disk_full"} counts it; nothing half-written is listed
or left behind; with room again the next Checkpoint commits.

A resume over checkpoints that do not validate: where none does, `trident serve` (with
--resume, or checkpoint.resume from the environment as the image sets it) stops with exit 2
naming each and why, instead of starting fresh at step 0; where an older one does, it restores
that one and warns naming what it skipped; checkpoint.fresh_if_invalid chooses a fresh start.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import SERVING, SMALL, committed, edit_manifest, running_server

from service.checkpoint import list_checkpoints
from service.client.client import TridentClient
from service.testing.serverproc import clean_env, scrape, serve_command, value

VOLUME_BYTES = 4 * 1024 * 1024
LEFT_FREE = 8 * 1024  # room for a few small files, never for a checkpoint
WAIT_S = 60


@contextlib.contextmanager
def small_volume(where: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted at `where` (root only: skipped elsewhere), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={VOLUME_BYTES}", "tmpfs",
                              str(where)], capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(volume: Path, leave: int) -> Path:
    """A ballast file taking all but about `leave` bytes of `volume`."""
    ballast = volume / "ballast"
    with open(ballast, "wb") as fh:
        free = os.statvfs(volume).f_bavail * os.statvfs(volume).f_frsize
        fh.write(b"\0" * max(0, free - leave))
    return ballast


def test_a_full_volume_answers_resource_exhausted(tmp_path: Path) -> None:
    with small_volume(tmp_path / "volume") as volume:
        root = volume / "checkpoints"
        with running_server(tmp_path / "server", checkpoint_dir=root) as server:
            ballast = fill(volume, LEFT_FREE)
            with TridentClient(server.target) as client:
                with pytest.raises(grpc.RpcError) as refused:
                    client.checkpoint("full")
                error = refused.value
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
                details = error.details()
                assert str(root) in details and "needs" in details and "free" in details, details
                assert "internal error" not in details
                assert dict(error.trailing_metadata() or ()).get("x-request-id")

                samples = scrape(server)
                failures = "trident_checkpoint_failures_total"
                assert value(samples, failures, reason="disk_full") == 1
                assert value(samples, failures, reason="error") == 0
                assert value(samples, "trident_rpc_errors_total", method="Checkpoint",
                             code="RESOURCE_EXHAUSTED") == 1  # fmt: skip
                assert not client.list_checkpoints()
                assert {p.name for p in root.iterdir()} <= {".commit.lock"}  # no .tmp-* left

                ballast.unlink()  # room again: the next one commits
                assert client.checkpoint("roomy").name == "roomy"
            assert [c.name for c in list_checkpoints(root)][-1] == "roomy"
            failed = server.events("checkpoint failed")
            assert [e["reason"] for e in failed] == ["disk_full"]
            assert "Traceback" not in server.stderr()
            assert not server.events("internal error")


def serve_resume(tmp_path: Path, root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`trident serve` over `root` with `env`, run to its end (it is expected to stop)."""
    command = serve_command(root, [*SMALL, *SERVING])
    return subprocess.run(command, cwd=tmp_path, env={**clean_env(), **env}, capture_output=True,
                          text=True, timeout=WAIT_S)  # fmt: skip


def test_resume_refuses_when_no_checkpoint_validates(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    committed(root, "only")
    edit_manifest(root, "only")
    (root / "bare").mkdir()  # a checkpoint's name, no manifest
    stopped = serve_resume(tmp_path, root, {"TRIDENT_CHECKPOINT__RESUME": "true"})
    assert stopped.returncode == 2, stopped.stderr
    assert "no valid checkpoint" in stopped.stderr
    assert "only:" in stopped.stderr and "manifest_sha256" in stopped.stderr, stopped.stderr
    assert "bare:" in stopped.stderr and "missing" in stopped.stderr, stopped.stderr
    assert '"serving"' not in stopped.stderr
    assert sorted(p.name for p in root.iterdir()) == [".commit.lock", "bare", "only"]


def test_resume_falls_back_with_a_warning_or_starts_fresh_when_told(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    committed(root, "older", "newer")
    edit_manifest(root, "newer")
    with running_server(tmp_path / "a", checkpoint_dir=root, extra_args=["--resume"]) as server:
        assert [e["name"] for e in server.events("restore")] == ["older"]
        skipped = server.events("resume skipped checkpoint")
        assert [(e["level"], e["name"], e["instead"]) for e in skipped] == [
            ("WARNING", "newer", "older")
        ]
        assert "manifest_sha256" in skipped[0]["reason"]

    bad = tmp_path / "bad"
    committed(bad, "only")
    edit_manifest(bad, "only")
    with running_server(tmp_path / "b", "checkpoint.fresh_if_invalid=true", checkpoint_dir=bad,
                        extra_args=["--resume"]) as server:  # fmt: skip
        assert not server.events("restore")
        skipped = server.events("resume skipped checkpoint")
        assert [(e["level"], e["name"], e["instead"]) for e in skipped] == [
            ("WARNING", "only", None)
        ]
        [resume] = server.events("resume")
        assert resume["level"] == "WARNING" and resume["checkpoint"] is None
