"""The public contract: stubs are current, the .proto is lint-clean, the service is complete."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from service.api.trident.v1 import trainer_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
STUBS = ("trainer_pb2.py", "trainer_pb2.pyi", "trainer_pb2_grpc.py")


def test_checked_in_stubs_match_the_proto(tmp_path: Path) -> None:
    subprocess.run(["bash", str(ROOT / "protos/generate.sh"), str(tmp_path)], check=True)
    fresh = tmp_path / "service/api/trident/v1"
    for name in STUBS:
        checked_in = (ROOT / "service/api/trident/v1" / name).read_bytes()
        assert (fresh / name).read_bytes() == checked_in, (
            f"service/api/trident/v1/{name} is stale: run protos/generate.sh"
        )


def _buf() -> str | None:
    local = ROOT / ".ci/node/node_modules/.bin/buf"
    return str(local) if local.exists() else shutil.which("buf")


def test_proto_is_lint_clean() -> None:
    buf = _buf()
    if buf is None:
        if os.environ.get("CI"):
            pytest.fail("buf is missing in CI: .ci/run installs it from npm (@bufbuild/buf)")
        pytest.skip("buf not installed (npm install --prefix .ci/node @bufbuild/buf)")
    done = subprocess.run([buf, "lint"], cwd=ROOT / "protos", capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_service_has_every_method_of_the_contract() -> None:
    service = pb.DESCRIPTOR.services_by_name["TrainerService"]
    assert service.full_name == "trident.v1.TrainerService"
    assert {m.name for m in service.methods} == {
        "Step",
        "StreamStep",
        "Interact",
        "Act",
        "Checkpoint",
        "Restore",
        "ListCheckpoints",
        "GetStatus",
        "UpdateHyperparams",
    }
    stream = service.methods_by_name["StreamStep"]
    assert stream.client_streaming and stream.server_streaming


# The contract as released: no release tag yet, so the main commit this check was added on
# (2026-12, after CheckpointInfo's field 5 was reserved). Move it to the first release tag.
BASELINE = "d927e5ce37b22e9f5077251df19d4829a625dcab"


def test_proto_is_backward_compatible_with_the_baseline(tmp_path: Path) -> None:
    buf = _buf()
    if buf is None:
        if os.environ.get("CI"):
            pytest.fail("buf is missing in CI: .ci/run installs it from npm (@bufbuild/buf)")
        pytest.skip("buf not installed (npm install --prefix .ci/node @bufbuild/buf)")
    # git archive rather than buf's `.git#ref=` input: it reads worktrees and partial clones.
    archive = subprocess.run(["git", "archive", BASELINE, "protos"], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        message = f"baseline {BASELINE} is not in this clone (fetch it, or clone deeper)"
        if os.environ.get("CI"):
            pytest.fail(message + ": " + archive.stderr.decode())
        pytest.skip(message)
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive.stdout, check=True)
    done = subprocess.run([buf, "breaking", "--against", str(tmp_path / "protos")],
                          cwd=ROOT / "protos", capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
