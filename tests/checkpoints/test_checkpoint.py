"""Tests for service.checkpoint: exact resume, crash consistency, corruption, names, pruning."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from checkpoint_writer import checkpoint_config, rollout
from conftest import random_rollout, small_config
from safetensors.numpy import save as save_tensors

from service.checkpoint import (
    COMMIT_LOCK,
    clean_temporaries,
    latest_checkpoint,
    list_checkpoints,
    load_policy,
    restore_checkpoint,
    save_checkpoint,
)
from service.config import Config
from service.errors import (
    CheckpointCorrupt,
    CheckpointIncompatible,
    CheckpointNotFound,
    InvalidInput,
)
from service.step_ledger import StepKey, StepLedger
from service.trainer.trainer import HOT_KEYS, Trainer
from service.types import ActMode, CheckpointInfo, StepResult

WRITER = Path(__file__).resolve().parents[1] / "checkpoint_writer.py"
FILES = [
    "config.json",
    "counters.safetensors",
    "ledger.json",
    "manifest.json",
    "optim.safetensors",
    "params.safetensors",
    "replay.safetensors",
    "rng.safetensors",
    "target.safetensors",
]


def trained(config: Config, seed: int, steps: int, start: int = 0) -> Trainer:
    """A trainer advanced by the rollouts start .. start + steps - 1 of the data from `seed`."""
    trainer = Trainer(config)
    advance(trainer, seed, start, steps)
    return trainer


def advance(trainer: Trainer, seed: int, start: int, steps: int) -> None:
    for step in range(start, start + steps):
        result = trainer.step(rollout(seed, step))
        assert result.updates_applied > 0 and not result.skipped


def state_bytes(trainer: Trainer) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Every state tensor as (dtype, shape, raw bytes), for exact comparison."""
    return {k: (v.dtype.str, v.shape, v.tobytes()) for k, v in trainer.state_dict().items()}


class Snapshot:
    """A trainer's full state and config, to show a failed operation changed nothing."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.digest = trainer.param_digest()
        self.state = state_bytes(trainer)
        self.config = trainer.config

    def assert_unchanged(self, full: bool = True) -> None:
        assert self.trainer.param_digest() == self.digest
        if full:
            assert state_bytes(self.trainer) == self.state
            assert self.trainer.config == self.config


def seal(body: dict[str, Any]) -> bytes:
    """A manifest's bytes as the format has them: `body` plus `manifest_sha256`, the sha256 of
    the canonical JSON of `body` (sorted keys, no spaces)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    sealed = {**body, "manifest_sha256": hashlib.sha256(canonical.encode()).hexdigest()}
    return (json.dumps(sealed, sort_keys=True, indent=1) + "\n").encode()


def reseal(directory: Path, mutate: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite a checkpoint's manifest after `mutate`, with a valid seal (a consistent lie)."""
    path = directory / "manifest.json"
    body = json.loads(path.read_bytes())
    assert seal({k: v for k, v in body.items() if k != "manifest_sha256"}) == path.read_bytes()
    body.pop("manifest_sha256")
    mutate(body)
    path.write_bytes(seal(body))


def replace_file(directory: Path, filename: str, data: bytes) -> None:
    """Replace a file and its manifest entry consistently (size and sha256 match)."""
    (directory / filename).write_bytes(data)
    entry = hashlib.sha256(data).hexdigest()

    def mutate(body: dict[str, Any]) -> None:
        body["files"][filename] = {"sha256": entry, "bytes": len(data)}

    reseal(directory, mutate)


@pytest.fixture(scope="module")
def config() -> Config:
    return checkpoint_config()


# ------------------------------------------------------------------------------ exact resume
def test_restore_into_fresh_trainer_then_continue_is_bit_identical(
    tmp_path: Path, config: Config, seed: int, rng: np.random.Generator
) -> None:
    obs = rng.standard_normal((5, config.model.obs_dim)).astype(np.float32)
    never_stopped = trained(config, seed, 6)  # replay holds 6·16 rows: C51 trains from step 2 on
    never_stopped.act(obs, ActMode.SAMPLE)
    never_stopped.act(obs, ActMode.EPSILON_GREEDY, 0.5)
    info = save_checkpoint(never_stopped, tmp_path)
    assert info.name == "step-0000000006" and info.global_step == 6
    assert sorted(p.name for p in info.path.iterdir()) == FILES
    assert info.size_bytes == sum(p.stat().st_size for p in info.path.iterdir())

    resumed = Trainer(checkpoint_config("train.seed=7"))  # restore brings the saved train.seed
    assert resumed.param_digest() != never_stopped.param_digest()
    restored = restore_checkpoint(resumed, tmp_path, info.name)
    assert (restored.name, restored.global_step, restored.path) == (info.name, 6, info.path)
    assert state_bytes(resumed) == state_bytes(never_stopped)
    assert resumed.config == never_stopped.config

    for mode in ActMode:  # act counters came back: the same Philox draws
        a, b = never_stopped.act(obs, mode, 0.5), resumed.act(obs, mode, 0.5)
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.log_probs, b.log_probs)
        assert a.policy_version == b.policy_version == 6
    advance(never_stopped, seed, 6, 3)
    advance(resumed, seed, 6, 3)
    assert resumed.global_step == never_stopped.global_step == 9
    assert resumed.param_digest() == never_stopped.param_digest()
    assert state_bytes(resumed) == state_bytes(never_stopped)  # replay and counters too


def test_fresh_trainer_with_empty_replay_round_trips(
    tmp_path: Path, config: Config, seed: int
) -> None:
    fresh = Trainer(config)
    info = save_checkpoint(fresh, tmp_path)
    assert info.global_step == 0
    other = trained(config, seed, 2)
    restore_checkpoint(other, tmp_path, info.name)
    assert state_bytes(other) == state_bytes(fresh)
    assert other.state_dict()["replay/obs"].shape == (0, config.model.obs_dim)


def test_hot_hyperparameters_come_back(tmp_path: Path, config: Config, seed: int) -> None:
    trainer = trained(config, seed, 1)
    changed = {"optim.lr": 1.25e-3, "ppo.clip_eps": 0.3, "train.gamma": 0.97,
               "c51.target_tau": 0.01, "train.lambda_aux": 0.5}
    trainer.update_hyperparams(changed)
    info = save_checkpoint(trainer, tmp_path)
    fresh = Trainer(config)
    restore_checkpoint(fresh, tmp_path, info.name)
    for key in HOT_KEYS:
        section, _, name = key.partition(".")
        assert getattr(getattr(fresh.config, section), name) == getattr(
            getattr(trainer.config, section), name), key
    assert fresh.config.optim.lr == 1.25e-3 and fresh.config.ppo.clip_eps == 0.3
    advance(trainer, seed, 1, 1)
    advance(fresh, seed, 1, 1)
    assert fresh.param_digest() == trainer.param_digest()


# ------------------------------------------------------------------------------ crash consistency
@pytest.mark.slow
def test_sigkill_mid_save_never_leaves_a_bad_checkpoint(
    tmp_path: Path, config: Config, capsys: pytest.CaptureFixture[str], seed: int
) -> None:
    trials, keep_last = 24, 3
    chooser = random.Random(seed)
    reference = Trainer(config)
    digests = {0: reference.param_digest()}

    def digest_at(step: int) -> str:
        while reference.global_step < step:
            advance(reference, seed, reference.global_step, 1)
            digests[reference.global_step] = reference.param_digest()
        return digests[step]

    mid_save = restored = committed_max = 0
    started = time.perf_counter()
    for trial in range(trials):
        root = tmp_path / f"trial{trial}"
        child = subprocess.Popen(
            [sys.executable, str(WRITER), str(root), str(keep_last), "1000", str(seed)],
            stdout=subprocess.PIPE, text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            time.sleep(chooser.uniform(0.0, 0.4))
        finally:
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
        assert child.returncode == -9  # killed, not finished

        temporaries = sorted(p.name for p in root.glob(".tmp-*")) if root.exists() else []
        listed = list_checkpoints(root)
        assert all(not c.name.startswith(".") for c in listed)
        assert len(listed) <= keep_last + 1  # killed between commit and prune at most
        for info in listed:
            fresh = Trainer(config)
            restore_checkpoint(fresh, root, info.name)
            assert fresh.global_step == info.global_step
            assert fresh.param_digest() == digest_at(info.global_step)
            restored += 1
        committed_max = max([committed_max, *(c.global_step for c in listed)])
        mid_save += bool(temporaries)
        assert clean_temporaries(root) == len(temporaries)
        assert not list(root.glob(".tmp-*")) if root.exists() else True
        assert [c.name for c in list_checkpoints(root)] == [c.name for c in listed]
    with capsys.disabled():
        print(f"\n[crash test] {trials} SIGKILLs, {mid_save} mid-save (temporary left behind), "
              f"{restored} checkpoints restored and matched, steps up to {committed_max}, "
              f"{time.perf_counter() - started:.1f} s")
    assert mid_save > 0 and restored > 0


# ------------------------------------------------------------------------------ corruption
def flip(path: Path, position: int, mask: int = 0xFF) -> None:
    """XOR one byte in place (twice restores it)."""
    with open(path, "r+b") as fh:
        fh.seek(position)
        byte = fh.read(1)[0]
        fh.seek(position)
        fh.write(bytes([byte ^ mask]))


def test_one_flipped_byte_in_any_file_is_corrupt(tmp_path: Path, config: Config, seed: int) -> None:
    good = save_checkpoint(trained(config, seed, 2), tmp_path)
    bad = save_checkpoint(trained(config, seed, 3), tmp_path)
    victim = trained(config, seed, 1, start=50)
    snapshot = Snapshot(victim)
    chooser = random.Random(seed)
    for filename in FILES:
        path = bad.path / filename
        size = path.stat().st_size
        if filename == "manifest.json":  # every byte, two masks: JSON can stay valid
            flips = [(p, m) for p in range(size) for m in (0x01, 0xFF)]
        else:
            positions = [0, size // 2, size - 1, *chooser.sample(range(size), 5)]
            flips = [(p, 0x01) for p in positions]
        for position, mask in flips:
            flip(path, position, mask)
            with pytest.raises(CheckpointCorrupt) as error:
                restore_checkpoint(victim, tmp_path, bad.name)
            assert filename in str(error.value)
            snapshot.assert_unchanged(full=False)
            flip(path, position, mask)
        snapshot.assert_unchanged()
    restore_checkpoint(victim, tmp_path, good.name)  # the older good one still restores
    assert victim.param_digest() == trained(config, seed, 2).param_digest()
    restore_checkpoint(victim, tmp_path, bad.name)  # and the repaired one too


@pytest.mark.parametrize("filename", FILES)
@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_truncated_or_missing_file_is_corrupt(
    tmp_path: Path, config: Config, filename: str, damage: str, seed: int
) -> None:
    info = save_checkpoint(trained(config, seed, 1), tmp_path)
    path = info.path / filename
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-7])
    else:
        path.unlink()
    victim = trained(config, seed, 1, start=9)
    snapshot = Snapshot(victim)
    # A checkpoint without a manifest was never committed: not found, and not listed.
    expected = CheckpointNotFound if (filename, damage) == ("manifest.json", "delete") \
        else CheckpointCorrupt
    with pytest.raises(expected, match=re.escape(filename if expected is CheckpointCorrupt
                                                 else info.name)):
        restore_checkpoint(victim, tmp_path, info.name)
    snapshot.assert_unchanged()


def test_extra_file_is_corrupt(tmp_path: Path, config: Config, seed: int) -> None:
    info = save_checkpoint(trained(config, seed, 1), tmp_path)
    victim = Trainer(config)
    snapshot = Snapshot(victim)
    (info.path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointCorrupt, match=re.escape("notes.txt")):
        restore_checkpoint(victim, tmp_path, info.name)
    (info.path / "notes.txt").unlink()
    (info.path / "sub").mkdir()
    with pytest.raises(CheckpointCorrupt, match="sub"):
        restore_checkpoint(victim, tmp_path, info.name)
    snapshot.assert_unchanged()


def test_consistent_but_wrong_checkpoint_rolls_back(
    tmp_path: Path, config: Config, seed: int
) -> None:
    """Files that match the manifest yet not the trainer or the digest: nothing changes."""
    victim = trained(config, seed, 1, start=20)
    snapshot = Snapshot(victim)

    info = save_checkpoint(trained(config, seed, 2), tmp_path, name="wrong-digest")
    reseal(info.path, lambda body: body.update(param_digest="0" * 64))
    with pytest.raises(CheckpointCorrupt, match="digest"):
        restore_checkpoint(victim, tmp_path, info.name)
    snapshot.assert_unchanged()

    info = save_checkpoint(trained(config, seed, 2), tmp_path, name="wrong-shape")
    _, params = load_policy(tmp_path, info.name)
    params["encoder/W0"] = np.zeros((3, 3), np.float32)
    replace_file(info.path, "params.safetensors", save_tensors(params))
    with pytest.raises(CheckpointCorrupt, match="encoder/W0"):
        restore_checkpoint(victim, tmp_path, info.name)
    snapshot.assert_unchanged()

    info = save_checkpoint(trained(config, seed, 2), tmp_path, name="wrong-format")
    replace_file(info.path, "rng.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    with pytest.raises(CheckpointCorrupt, match=re.escape("rng.safetensors")):
        restore_checkpoint(victim, tmp_path, info.name)
    snapshot.assert_unchanged()

    info = save_checkpoint(trained(config, seed, 2), tmp_path, name="bad-file-name")
    reseal(info.path, lambda body: body["files"].update({"../x.json": {"sha256": "", "bytes": 0}}))
    with pytest.raises(CheckpointCorrupt, match="invalid file name"):
        restore_checkpoint(victim, tmp_path, info.name)
    snapshot.assert_unchanged()


def test_a_failed_restore_puts_back_the_settings_the_update_reads(
    tmp_path: Path, config: Config, seed: int
) -> None:
    """The checkpoint's hot settings are applied before its digest is checked; when the check
    fails, the next Step runs with the trainer's own settings again, as a twin's does."""
    victim, twin = trained(config, seed, 1, start=20), trained(config, seed, 1, start=20)
    source = trained(config, seed, 2)
    source.update_hyperparams({"optim.lr": 0.05, "train.gamma": 0.5, "ppo.ent_coef": 0.2})
    info = save_checkpoint(source, tmp_path, name="wrong-digest")
    reseal(info.path, lambda body: body.update(param_digest="0" * 64))
    with pytest.raises(CheckpointCorrupt, match="digest"):
        restore_checkpoint(victim, tmp_path, info.name)
    assert victim.config == twin.config
    advance(victim, seed, 40, 1)
    advance(twin, seed, 40, 1)
    assert victim.param_digest() == twin.param_digest()


def test_not_found(tmp_path: Path, config: Config, seed: int) -> None:
    victim = Trainer(config)
    snapshot = Snapshot(victim)
    info = save_checkpoint(trained(config, seed, 1), tmp_path)
    temp = tmp_path / ".tmp-step-0000000002-123-abcd"
    temp.mkdir()
    for filename in FILES:
        (temp / filename).write_bytes((info.path / filename).read_bytes())
    (tmp_path / "empty").mkdir()
    (tmp_path / "plainfile").write_text("x")
    for name in ["nope", "empty", "plainfile"]:
        with pytest.raises(CheckpointNotFound):
            restore_checkpoint(victim, tmp_path, name)
        with pytest.raises(CheckpointNotFound):
            load_policy(tmp_path, name)
    # A temporary or a path is not a checkpoint name at all: the caller's input is wrong.
    for name in [temp.name, "../" + tmp_path.name + "/" + info.name, "/etc/passwd"]:
        with pytest.raises(InvalidInput, match="name"):
            restore_checkpoint(victim, tmp_path, name)
        with pytest.raises(InvalidInput, match="name"):
            load_policy(tmp_path, name)
    with pytest.raises(CheckpointNotFound):
        restore_checkpoint(victim, tmp_path / "missing-root", info.name)
    snapshot.assert_unchanged()


def test_load_policy_is_verified(tmp_path: Path, config: Config, seed: int) -> None:
    trainer = trained(config, seed, 2)
    info = save_checkpoint(trainer, tmp_path)
    _, params = load_policy(tmp_path, info.name)
    policy = {k.removeprefix("params/"): v for k, v in trainer.state_dict().items()
              if k.startswith("params/")}  # fmt: skip
    assert params.keys() == policy.keys() == {*trainer.state.params, "v/norm"}
    assert load_policy(tmp_path, info.name)[0] == trainer.config
    for name, array in policy.items():
        np.testing.assert_array_equal(params[name], array)
        assert params[name].dtype == array.dtype
    flip(info.path / "params.safetensors", 100)
    with pytest.raises(CheckpointCorrupt, match=re.escape("params.safetensors")):
        load_policy(tmp_path, info.name)
    flip(info.path / "params.safetensors", 100)
    flip(info.path / "manifest.json", 10)
    with pytest.raises(CheckpointCorrupt, match=re.escape("manifest.json")):
        load_policy(tmp_path, info.name)


# ------------------------------------------------------------------------------ compatibility
def test_incompatible_config_names_each_key(tmp_path: Path, config: Config, seed: int) -> None:
    source = trained(config, seed, 1)
    info = save_checkpoint(source, tmp_path)
    other = Trainer(
        checkpoint_config("model.hidden_dim=32", "c51.num_atoms=21", "ppo.value_norm=false")
    )
    snapshot = Snapshot(other)
    with pytest.raises(CheckpointIncompatible) as error:
        restore_checkpoint(other, tmp_path, info.name)
    message = str(error.value)
    assert "model.hidden_dim: checkpoint 16, trainer 32" in message
    assert "c51.num_atoms: checkpoint 51, trainer 21" in message
    assert "ppo.value_norm: checkpoint True, trainer False" in message
    snapshot.assert_unchanged()
    # Settings that do not shape the state may differ; the checkpoint's hot ones win.
    relaxed = Trainer(checkpoint_config("ppo.epochs=3", "optim.lr=0.01"))
    restore_checkpoint(relaxed, tmp_path, info.name)
    assert relaxed.config.ppo.epochs == 3 and relaxed.config.optim.lr == source.config.optim.lr


# ------------------------------------------------------------------------------ names
BAD_NAMES = ["..", "../x", "a/b", "/etc/passwd", "a\\b", "", " ", ".hidden", "a\x00b",
             "x" * 200, "x" * 129, "a..b", "a\n", "-a", "_a", "ü", "a b", ".tmp-x-1-ab", 5]


def tree(path: Path) -> list[str]:
    """Every path under `path` but the root's commit lock (a save takes it before it commits)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.name != COMMIT_LOCK)


def test_bad_names_are_rejected_and_create_nothing(tmp_path: Path, config: Config) -> None:
    trainer = Trainer(config)
    root = tmp_path / "root" / "checkpoints"
    (tmp_path / "root").mkdir()
    for name in BAD_NAMES:
        with pytest.raises(InvalidInput) as error:
            save_checkpoint(trainer, root, name=name)  # type: ignore[arg-type]
        assert error.value.field == "name"
        assert "[A-Za-z0-9._-]" in str(error.value)
    assert tree(tmp_path) == ["root"]
    info = save_checkpoint(trainer, root, name="x" * 128)
    assert info.path == root / ("x" * 128)
    assert save_checkpoint(trainer, root, name="v1.2_final-A").name == "v1.2_final-A"


def test_duplicate_name_is_rejected(tmp_path: Path, config: Config, seed: int) -> None:
    trainer = trained(config, seed, 1)
    info = save_checkpoint(trainer, tmp_path, name="best")
    manifest = (info.path / "manifest.json").read_bytes()
    advance(trainer, seed, 1, 1)
    with pytest.raises(InvalidInput, match="immutable"):
        save_checkpoint(trainer, tmp_path, name="best")
    (tmp_path / "occupied").write_text("not a checkpoint")
    with pytest.raises(InvalidInput, match="immutable"):
        save_checkpoint(trainer, tmp_path, name="occupied")
    assert (info.path / "manifest.json").read_bytes() == manifest
    assert not list(tmp_path.glob(".tmp-*"))
    with pytest.raises(InvalidInput, match="keep_last"):
        save_checkpoint(trainer, tmp_path, name="zero", keep_last=0)


def test_failed_save_leaves_nothing(
    tmp_path: Path, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync

    def broken(fd: int) -> None:
        """The last write before the commit fails: the fsync of the full temporary directory."""
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError("disk full")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(Trainer(config), tmp_path)
    assert tree(tmp_path) == []


# ------------------------------------------------------------------------------ listing, pruning
def names(infos: list[CheckpointInfo]) -> list[str]:
    return [info.name for info in infos]


def test_save_time_is_recorded_once_and_listed(tmp_path: Path, config: Config) -> None:
    """save_ms is the save's own measurement, kept in the manifest: the save, the listing and a
    restore report the same number, and it fits inside the call's wall time."""
    trainer = Trainer(config)
    started = time.perf_counter()
    saved = save_checkpoint(trainer, tmp_path, name="timed")
    wall_ms = (time.perf_counter() - started) * 1000
    assert saved.save_ms is not None and 0 < saved.save_ms <= wall_ms
    (listed,) = list_checkpoints(tmp_path)
    restored = restore_checkpoint(Trainer(config), tmp_path, "timed")
    assert listed.save_ms == restored.save_ms == saved.save_ms


def test_keep_last_prunes_oldest_and_lists_newest_first(
    tmp_path: Path, config: Config, seed: int
) -> None:
    trainer = Trainer(config)
    assert list_checkpoints(tmp_path / "none") == [] and latest_checkpoint(tmp_path) is None
    for step in range(6):
        save_checkpoint(trainer, tmp_path, keep_last=3)
        advance(trainer, seed, step, 1)
    expected = ["step-0000000005", "step-0000000004", "step-0000000003"]
    assert names(list_checkpoints(tmp_path)) == expected
    listed = sorted(p.name for p in tmp_path.iterdir() if p.name != COMMIT_LOCK)
    assert listed == sorted(expected)  # deleted, not hidden
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == expected[0] and latest.global_step == 5
    assert latest.size_bytes > 0
    # Order is by commit, the one committed last first, not by name.
    save_checkpoint(trainer, tmp_path, name="aaa", keep_last=10)
    save_checkpoint(trainer, tmp_path, name="000", keep_last=10)
    assert names(list_checkpoints(tmp_path)) == ["000", "aaa", *expected]
    # The default comes from the config; the checkpoint just written is always kept, and is
    # the newest whatever its global step.
    info = save_checkpoint(Trainer(checkpoint_config("checkpoint.keep_last=2")), tmp_path,
                           name="older-step")
    assert names(list_checkpoints(tmp_path)) == ["older-step", "000"]
    assert info.global_step == 0


def test_the_checkpoint_committed_last_is_the_newest_after_a_rollback(
    tmp_path: Path, config: Config, seed: int
) -> None:
    """Saves at steps 2 and 4, a restore of step 2, a save at step 3 of the new line: that one
    is the newest for listing, `latest_checkpoint` (what --resume restores) and pruning, and
    its commit sequence continues the root's, also after the older ones are pruned."""
    trainer = Trainer(config)
    advance(trainer, seed, 0, 2)
    save_checkpoint(trainer, tmp_path, keep_last=5)
    advance(trainer, seed, 2, 2)
    abandoned = save_checkpoint(trainer, tmp_path, keep_last=5)
    restore_checkpoint(trainer, tmp_path, "step-0000000002")
    advance(trainer, seed, 2, 1)
    new_line = save_checkpoint(trainer, tmp_path, keep_last=5)
    assert (abandoned.global_step, new_line.global_step) == (4, 3)
    assert [c.commit_sequence for c in list_checkpoints(tmp_path)] == [3, 2, 1]
    assert names(list_checkpoints(tmp_path)) == [
        "step-0000000003", "step-0000000004", "step-0000000002"]  # fmt: skip
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == new_line.name
    resumed = Trainer(config)
    restore_checkpoint(resumed, tmp_path, latest.name)
    assert resumed.param_digest() == trainer.param_digest()
    # Keep-last keeps what was committed last: the abandoned line's step 4 is older.
    advance(trainer, seed, 3, 1)
    kept = save_checkpoint(trainer, tmp_path, name="step-4-of-the-new-line", keep_last=2)
    assert names(list_checkpoints(tmp_path)) == [kept.name, "step-0000000003"]
    assert kept.commit_sequence == 4


def test_checkpoints_without_a_commit_sequence_are_older_than_those_with_one(
    tmp_path: Path, config: Config
) -> None:
    """A manifest written before commit sequences (still a readable format) lists after every
    checkpoint that has one, in creation order among its kind."""
    trainer = Trainer(config)
    first = save_checkpoint(trainer, tmp_path, name="legacy")
    manifest = tmp_path / "legacy" / "manifest.json"
    body = json.loads(manifest.read_text())
    del body["commit_sequence"], body["manifest_sha256"]
    body["created_unix"] = time.time() + 3600  # created "later": the sequence still decides
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    sealed = {**body, "manifest_sha256": hashlib.sha256(canonical.encode()).hexdigest()}
    manifest.write_text(json.dumps(sealed, sort_keys=True, indent=1) + "\n")
    assert first.commit_sequence == 1 and latest_checkpoint(tmp_path).commit_sequence == 0
    later = save_checkpoint(trainer, tmp_path, name="sequenced")
    assert later.commit_sequence == 1  # the legacy one counts as 0
    assert names(list_checkpoints(tmp_path)) == ["sequenced", "legacy"]


def test_listing_ignores_temporaries_and_garbage(tmp_path: Path, config: Config, seed: int) -> None:
    info = save_checkpoint(trained(config, seed, 1), tmp_path)
    copy = tmp_path / ".tmp-step-0000000009-1-ffff"
    copy.mkdir()
    for filename in FILES:
        (copy / filename).write_bytes((info.path / filename).read_bytes())
    (tmp_path / ".tmp-half-2-eeee").mkdir()
    (tmp_path / ".tmp-stray-file").write_text("x")
    (tmp_path / "no-manifest").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "link").symlink_to(info.path)
    assert names(list_checkpoints(tmp_path)) == [info.name]
    assert clean_temporaries(tmp_path) == 3
    assert not list(tmp_path.glob(".tmp-*"))
    assert clean_temporaries(tmp_path) == 0 and clean_temporaries(tmp_path / "none") == 0
    assert names(list_checkpoints(tmp_path)) == [info.name]
    with pytest.raises(CheckpointCorrupt, match="not valid JSON"):
        restore_checkpoint(Trainer(config), tmp_path, "broken")


# ------------------------------------------------------------------------------ formats
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
FIXTURE_SETTINGS = ("replay.capacity=64", "train.seed=7")  # tests/fixtures/checkpoints/README.md


@pytest.mark.parametrize("version", [2, 3])
def test_committed_checkpoints_of_each_readable_format_keep_loading(
    tmp_path: Path, version: int, rng: np.random.Generator
) -> None:
    """A checkpoint written by the build of each format: version 2 (before the ledger)
    migrates to an empty ledger, version 3 brings its keys; both continue training."""
    root = tmp_path / "checkpoints"
    shutil.copytree(FIXTURES, root)
    trainer = Trainer(small_config(*FIXTURE_SETTINGS))
    ledger = StepLedger(capacity=8)
    ledger.record(StepKey("before-restore", 0), StepResult(), None)
    info = restore_checkpoint(trainer, root, f"format-{version}", ledger=ledger)
    manifest = json.loads((root / f"format-{version}" / "manifest.json").read_text())
    assert manifest["format_version"] == version
    assert info.global_step == trainer.global_step == 3
    assert trainer.param_digest() == manifest["param_digest"]
    expected = [StepKey("fixture-actor", s) for s in range(3)] if version == 3 else []
    assert ledger.applied_keys() == expected
    result = trainer.step(random_rollout(rng))
    assert result.global_step == 4 and not result.skipped


@pytest.mark.parametrize("version", [1, 4])
def test_a_format_this_build_cannot_read_is_refused_naming_both(
    tmp_path: Path, config: Config, seed: int, version: int
) -> None:
    info = save_checkpoint(trained(config, seed, 1), tmp_path)
    reseal(info.path, lambda body: body.update(format_version=version))
    victim = Trainer(config)
    snapshot = Snapshot(victim)
    expected = f"format_version {version}; this build reads format_version 2 and 3 (writes 3)"
    with pytest.raises(CheckpointIncompatible, match=re.escape(expected)):
        restore_checkpoint(victim, tmp_path, info.name)
    snapshot.assert_unchanged()
