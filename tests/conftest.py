"""What the tests share: fresh random draws (`seed`, `rng`), the small model the CPU suite trains
(`SMALL`, `small_config`), random rollouts for it and Steps on them (`random_rollout`,
`random_steps`; the model and the rollouts come from service/testing/models.py, which the
benches share), a real server running it (`running_server`) and `wait_until`, the one way a
test waits for something.

Test modules import the plain helpers (`from conftest import random_rollout`); pytest puts this
directory on `sys.path` before it imports them.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pytest

from service.testing.models import SMALL, random_rollout, small_config
from service.testing.serverproc import ServerProcess, TlsFiles
from service.types import StepResult

if TYPE_CHECKING:
    from service.trainer.trainer import Trainer

Found = TypeVar("Found")

# Test-server settings that do not touch the math: a short drain, so shutdown is quick; gRPC in
# the server's own process whatever the machine's cores (a test that runs front-end processes
# asks for them, tests/server/test_front_ends.py and the parametrized ones).
SERVING = ("server.shutdown_grace_s=5", "server.front_ends=0")


def fresh_seed(bits: int = 32) -> int:
    """TRIDENT_TEST_SEED when set, else a fresh one; printed, so a failure's report says how to
    replay it."""
    seed = int(os.environ.get("TRIDENT_TEST_SEED") or secrets.randbits(bits))
    print(f"seed {seed} (rerun with TRIDENT_TEST_SEED={seed})")
    return seed


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `slow` first, the rest in collection order: with two workers (`-n 2`) the
    README test (about 150 s) starts at once instead of last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def seed() -> int:
    return fresh_seed()


@pytest.fixture
def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def committed(root: Path, *names: str) -> None:
    """Checkpoints `names` of the tests' small model under `root`, committed in that order."""
    from service.checkpoint import save_checkpoint
    from service.trainer.trainer import Trainer

    trainer = Trainer(small_config())
    for name in names:
        save_checkpoint(trainer, root, name)


def edit_manifest(root: Path, name: str) -> None:
    """Change one byte of a checkpoint's manifest (its global step), as a hand edit would."""
    from service.checkpoint import MANIFEST

    path = root / name / MANIFEST
    path.write_text(path.read_text().replace('"global_step": 0', '"global_step": 7'))


def random_steps(trainer: Trainer, seed: int, count: int) -> list[StepResult]:
    """`count` Steps of `trainer` on the default-shaped `random_rollout`s drawn from `seed`: two
    trainers given the same seed see the same data."""
    rng = np.random.default_rng(seed)
    return [trainer.step(random_rollout(rng)) for _ in range(count)]


def running_server(
    tmp_path: Path,
    *overrides: str,
    token: str | None = None,
    tls: TlsFiles | None = None,
    extra_args: Sequence[str] = (),
    checkpoint_dir: Path | None = None,
) -> ServerProcess:
    """A serving `trident serve` process of the small model plus `overrides`; stopped at the
    end of a `with` block, or by `terminate()`."""
    settings = [*SMALL, *SERVING, *overrides]
    if token is not None:
        settings.append(f"server.auth_token={token}")
    if tls is not None:
        settings.extend(tls.overrides())
    return ServerProcess.start(
        tmp_path, settings, checkpoint_dir=checkpoint_dir, extra_args=extra_args
    )


def free_port() -> int:
    """A loopback TCP port free a moment ago, for a process that must be told its port first
    (a rendezvous address, a server restarted on the same port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(
    condition: Callable[[], Found],
    timeout_s: float,
    what: str | Callable[[], str],
    interval_s: float = 0.01,
) -> Found:
    """Poll `condition` until it returns something truthy, and return that; fail naming `what`
    (a callable: worded at the failure, e.g. with a log) when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what if isinstance(what, str) else what()}: "
                                 f"not within {timeout_s} s")  # fmt: skip
        time.sleep(interval_s)
    return found
