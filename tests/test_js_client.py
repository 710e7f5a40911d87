"""A second language holds the contract: clients/js (Node, @grpc/grpc-js, the .proto loaded from
protos/ at run time) runs a random walk through Interact and calls Act, Step, Checkpoint and
Restore against a real server, exiting non-zero on anything the contract does not say."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import running_server

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "clients/js"
NPM_CACHE = ROOT / ".ci/npm-cache"  # ignored, like .ci/node: kept between runs
# The model the walk fits: 4 features, left or right; one rollout of 4 walkers is a Step.
MODEL = ("model.obs_dim=4", "model.num_actions=2", "train.num_envs=4")


def tools() -> tuple[str, str]:
    found = {name: shutil.which(name) for name in ("node", "npm")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{' and '.join(missing)} missing in CI: the JS client's test needs them")
        pytest.skip(f"{' and '.join(missing)} not installed (Node.js 18 or later)")
    return found["node"], found["npm"]  # type: ignore[return-value]


def test_js_client_holds_the_contract(tmp_path: Path) -> None:
    node, npm = tools()
    installed = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--cache", str(NPM_CACHE)],
        cwd=CLIENT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    with running_server(tmp_path, *MODEL) as server:
        done = subprocess.run(
            [node, "walk.mjs", "--server", server.target, "--envs", "4", "--rollout-len", "8"],
            cwd=CLIENT, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- server ---\n{server.stderr()}"
    assert "ok: the server holds the contract" in done.stdout, done.stdout
