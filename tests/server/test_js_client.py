"""A second language holds the contract: clients/js (Node, @grpc/grpc-js, the .proto loaded from
protos/ at run time) runs a random walk through Interact and calls Act, Step, Checkpoint and
Restore against a real server, exiting non-zero on anything the contract does not say.

The server and the walk run as README.md's "A client in another language" block shows them, every
argument as written but the addresses (ports the OS picks), the checkpoint directory (this
test's own) and the backend (the CPU suite's NumPy, GPU or not): no setting of the tests'
small model, so the walk meets the defaults a reader meets (a C51 head that has not trained
yet among them)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from readme_shell import blocks

from service.testing.serverproc import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients/js"
NPM_CACHE = ROOT / ".ci/npm-cache"  # ignored, like .ci/node: kept between runs
PLACES = {"--port", "--metrics-port", "--checkpoint-dir"}  # the harness picks these


def tools() -> tuple[str, str]:
    found = {name: shutil.which(name) for name in ("node", "npm")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{' and '.join(missing)} missing in CI: the JS client's test needs them")
        pytest.skip(f"{' and '.join(missing)} not installed (Node.js 18 or later)")
    return found["node"], found["npm"]  # type: ignore[return-value]


def readme_commands() -> tuple[list[str], list[str]]:
    """The README's JS quick start: the `trident serve` arguments and the walk's command line
    (`node walk.mjs ...`), each split into words, comments left."""
    (block,) = [b for b in blocks(ROOT / "README.md") if "node walk.mjs" in b.text]
    serve, walk = block.commands()
    serve_words = shlex.split(serve, comments=True)
    assert serve_words[:2] == ["trident", "serve"], serve
    *_, node = walk.split("#")[0].split("&&")  # cd clients/js && npm ci && node walk.mjs ...
    node_words = shlex.split(node)
    assert node_words[:2] == ["node", "walk.mjs"], walk
    return serve_words[2:], node_words[2:]


def without(words: list[str], flags: set[str]) -> list[str]:
    """`words` less each of `flags` and the value after it."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in flags:
            skip = True
        else:
            kept.append(word)
    return kept


def test_the_readme_runs_the_walk_at_the_defaults_it_shows() -> None:
    serve_args, walk_args = readme_commands()
    assert "--server" in walk_args and not {"--envs", "--rollout-len"} & set(walk_args)
    settings = [serve_args[i + 1] for i, word in enumerate(serve_args) if word == "--set"]
    assert settings == ["model.obs_dim=4", "model.num_actions=2", "train.num_envs=4"], settings


def test_js_client_holds_the_contract(tmp_path: Path) -> None:
    node, npm = tools()
    installed = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--cache", str(NPM_CACHE)],
        cwd=CLIENT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    serve_args, walk_args = readme_commands()
    serve_args = [*without(serve_args, PLACES), "--backend", "numpy"]
    walk_args = [*without(walk_args, {"--server"})]
    with ServerProcess.start(tmp_path, [], extra_args=serve_args) as server:
        done = subprocess.run(
            [node, "walk.mjs", *walk_args, "--server", server.target],
            cwd=CLIENT, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- server ---\n{server.stderr()}"
    assert "ok: the server holds the contract" in done.stdout, done.stdout
    # At the README's settings the replay holds fewer than replay.min_size transitions: the
    # reply had no C51 loss, and the walk held it to that.
    assert '"q"' not in done.stdout.split("Act x ")[1].splitlines()[0], done.stdout
