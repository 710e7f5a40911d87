"""The image installs from locks: deploy/requirements-{cpu,cuda}.lock pin every dependency with
its hashes (`make lock`), they pin a version of everything pyproject.toml asks for, and the
Dockerfile installs them with --require-hashes before Trident itself (--no-deps)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .tools import DEPLOY, REPO, dockerfile_instructions, final_stage

# The image's interpreter and platform, as `make lock` resolves for them.
IMAGE_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.0",
                 "sys_platform": "linux", "platform_system": "Linux",
                 "platform_machine": "x86_64", "implementation_name": "cpython"}  # fmt: skip
LOCKS = {"cpu": (), "cuda": ("cuda",)}  # variant -> the extras its lock adds
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)")


def read_lock(path: Path) -> dict[str, tuple[str, int]]:
    """name -> (pinned version, number of hashes); fails on a line that pins nothing."""
    pins: dict[str, tuple[str, int]] = {}
    entries = re.split(r"\n(?=\S)", path.read_text())
    for entry in entries:
        lines = [line for line in entry.splitlines() if not line.lstrip().startswith("#")]
        if not lines:
            continue
        match = PIN.match(lines[0])
        assert match is not None, f"{path.name}: not a pin: {lines[0]!r}"
        hashes = sum(len(re.findall(r"--hash=sha256:[0-9a-f]{64}", line)) for line in lines)
        pins[canonicalize_name(match["name"])] = (match["version"], hashes)
    return pins


def asked_for(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [*project["dependencies"]]
    for extra in extras:
        names += project["optional-dependencies"][extra]
    return [Requirement(name) for name in names]


@pytest.mark.parametrize("variant", LOCKS)
def test_each_lock_pins_with_hashes_what_pyproject_asks_for(variant: str) -> None:
    pins = read_lock(DEPLOY / f"requirements-{variant}.lock")
    assert pins and all(hashes >= 1 for _, hashes in pins.values()), pins
    for requirement in asked_for(LOCKS[variant]):
        if requirement.marker is not None and not requirement.marker.evaluate(IMAGE_MARKERS):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{variant} lock lacks {requirement} (run `make lock`)"
        version, _ = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{variant} lock pins {name}=={version}, pyproject.toml asks for {requirement} "
            "(run `make lock`)"
        )
    assert "trident" not in pins  # the project's own wheel comes from the build, not the lock


def test_the_cpu_lock_is_the_cuda_lock_without_the_cuda_extra() -> None:
    cpu, cuda = (read_lock(DEPLOY / f"requirements-{v}.lock") for v in LOCKS)
    assert set(cpu) < set(cuda) and "cupy-cuda13x" in set(cuda) - set(cpu)
    assert {name: cuda[name] for name in cpu} == cpu  # one resolution, the extra added


def test_the_image_installs_the_lock_with_hashes_then_trident_alone() -> None:
    builder = " ".join(args for keyword, args in dockerfile_instructions()
                       if keyword in ("COPY", "RUN"))  # fmt: skip
    assert "deploy/requirements-${VARIANT}.lock requirements.lock" in builder
    assert "--require-hashes --wheel-dir /wheels -r requirements.lock" in builder
    runs = " ".join(final_stage()["RUN"])
    assert "--require-hashes -r /tmp/requirements.lock" in runs
    assert "--no-index --no-deps /wheels/trident-*.whl" in runs
