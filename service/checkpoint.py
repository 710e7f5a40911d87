"""Checkpoints of a Trainer: one directory per name under a root, committed atomically.

Layout of `root/<name>/`: one `<group>.safetensors` per state group (params, target, optim,
replay, counters, rng), `config.json`, `ledger.json` (the idempotency keys of the Steps the
state includes, service/step_ledger.py), for a training job's checkpoint `job.safetensors`
(what the job needs beside the trainer to go on exactly: its markets, its clock), and
`manifest.json` (format version, global step,
commit sequence, parameter digest, backend, sha256 and size of every other file, and a sha256
of itself).
A save writes everything into `root/.tmp-<name>-<pid>-<random>`, fsyncs the files, the
manifest and the directory, renames it to `root/<name>` and fsyncs the root; only then does
it prune old checkpoints. Directories named `.tmp-*` are never read; a crash leaves at most
such a directory behind, which `clean_temporaries` removes. Tensors are safetensors, never
pickle, and every byte is hashed before it is parsed.

The newest checkpoint is the one committed last: each manifest records a commit sequence, one
more than the largest under the root when it was committed (taken and committed under a lock
on `root/.commit.lock`, so two saves never share one), and listing, `latest_checkpoint`
(`--resume`) and pruning all order by it. A Restore to an older checkpoint therefore starts a
line whose saves are newer than those of the line it left.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors

from service.config import Config, ConfigError
from service.errors import (
    CheckpointCorrupt,
    CheckpointDiskFull,
    CheckpointIncompatible,
    CheckpointNotFound,
    InvalidInput,
    NoValidCheckpoint,
)
from service.step_ledger import StepLedger
from service.trainer.trainer import HOT_KEYS, Trainer
from service.types import CheckpointInfo

# 2: the params group holds the value head's return statistics (params/v/norm).
# 3: ledger.json holds the keys of the applied Steps. A version-2 checkpoint loads with an
#    empty ledger (MIGRATED); version 1 lacks the statistics and is refused.
FORMAT_VERSION = 3
MIGRATED = (2,)
MANIFEST = "manifest.json"
CONFIG = "config.json"
COMMIT_LOCK = ".commit.lock"
JOB = "job.safetensors"  # a training job's own state, beside the trainer's
LEDGER = "ledger.json"
TEMP_PREFIX = ".tmp-"
NAME_RULE = "1-128 characters from [A-Za-z0-9._-], starting with a letter or digit, without '..'"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_FILE = re.compile(r"[a-z][a-z0-9_]*\.(safetensors|json)")
# Settings a checkpoint's tensors are shaped by (or that give them their meaning).
COMPATIBLE_KEYS = (
    "c51.num_atoms", "c51.v_min", "c51.v_max", "c51.n_step", "replay.capacity",
    "ppo.value_norm",  # whether the value head's outputs are in normalised units
)  # fmt: skip

# The errors of a volume with no room left: no space, no quota.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)

PathLike = str | os.PathLike[str]


# ------------------------------------------------------------------------------ names
def _is_name(name: object) -> TypeGuard[str]:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None and ".." not in name


def check_name(name: object) -> str:
    """`name` if it is a valid checkpoint name (a name, never a path), else InvalidInput."""
    if not _is_name(name):
        # Cut long names short: the message travels in gRPC trailing metadata, and one over the
        # client's 8 KiB limit turned this INVALID_ARGUMENT into RESOURCE_EXHAUSTED on the client.
        got = repr(name)
        got = got if len(got) <= 80 else f"{got[:64]}... ({len(got)} characters)"
        raise InvalidInput("name", f"a checkpoint name of {NAME_RULE}", got)
    return name


def _committed_dir(root: PathLike, name: object) -> Path:
    """The directory of committed checkpoint `name`; InvalidInput for a name that is not one
    (a path, a temporary), CheckpointNotFound when no checkpoint has it."""
    check_name(name)
    directory = Path(root) / str(name)
    if directory.is_symlink() or not (directory / MANIFEST).is_file():
        raise CheckpointNotFound(f"no checkpoint named {name!r} in {os.fspath(root)}")
    return directory


# ------------------------------------------------------------------------------ files
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> dict[str, Any]:
    """Write and fsync `data`; its manifest entry {sha256, bytes}."""
    with open(path, "xb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _read_verified(directory: Path, filename: str, entry: Mapping[str, Any]) -> bytes:
    """The bytes of a listed file after its size and sha256 match the manifest."""
    path = directory / filename
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointCorrupt(f"{path}: not a regular file")
        if info.st_size != entry["bytes"]:
            raise CheckpointCorrupt(f"{path}: {info.st_size} bytes, manifest says {entry['bytes']}")
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{path}: listed in the manifest but missing") from None
    except OSError as error:
        raise CheckpointCorrupt(f"{path}: unreadable ({error})") from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry["bytes"] or digest != entry["sha256"]:
        raise CheckpointCorrupt(
            f"{path}: sha256 {digest} does not match the manifest's {entry['sha256']}"
        )
    return data


# ------------------------------------------------------------------------------ manifest
def _seal(body: Mapping[str, Any]) -> bytes:
    """The manifest's bytes: canonical JSON of `body` plus the sha256 of that JSON."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    sealed = {**body, "manifest_sha256": hashlib.sha256(canonical.encode()).hexdigest()}
    return (json.dumps(sealed, sort_keys=True, indent=1) + "\n").encode()


def _check_manifest(body: Any, path: Path) -> None:
    """Raise CheckpointCorrupt unless `body` has every field with the right type."""
    fields = {
        "global_step": int,
        "param_digest": str,
        "created_unix": (int, float),
        "backend": str,
        "files": dict,
    }
    for key, kind in fields.items():
        if not isinstance(body.get(key), kind) or isinstance(body.get(key), bool):
            raise CheckpointCorrupt(f"{path}: field {key!r} is missing or malformed")
    for filename, entry in body["files"].items():
        if not _FILE.fullmatch(filename) or filename == MANIFEST:
            raise CheckpointCorrupt(f"{path}: lists an invalid file name {filename!r}")
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and type(entry.get("bytes")) is int
            and entry["bytes"] >= 0
        ):
            raise CheckpointCorrupt(f"{path}: malformed entry for {filename!r}")
    if CONFIG not in body["files"]:
        raise CheckpointCorrupt(f"{path}: does not list {CONFIG}")
    save_ms = body.get("save_ms")
    if save_ms is not None and (type(save_ms) not in (int, float) or not save_ms >= 0):
        raise CheckpointCorrupt(f"{path}: field 'save_ms' is malformed")
    sequence = body.get("commit_sequence")
    if sequence is not None and (type(sequence) is not int or sequence < 1):
        raise CheckpointCorrupt(f"{path}: field 'commit_sequence' is malformed")


def read_manifest(directory: Path) -> dict[str, Any]:
    """The verified manifest of a checkpoint directory.

    A missing manifest is CheckpointNotFound (nothing was committed there); unreadable,
    non-canonical or unsealed bytes are CheckpointCorrupt; a sealed manifest of another format
    version is CheckpointIncompatible.
    """
    path = directory / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointNotFound(f"no checkpoint in {directory}") from None
    except OSError as error:
        raise CheckpointCorrupt(f"{path}: unreadable ({error})") from None
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointCorrupt(f"{path}: not valid JSON ({error})") from None
    if not isinstance(body, dict):
        raise CheckpointCorrupt(f"{path}: not a JSON object")
    # The seal is the envelope of every format version: checked first, so that no changed
    # byte (the version's included) passes for anything but corruption.
    body.pop("manifest_sha256", None)
    if _seal(body) != raw:
        raise CheckpointCorrupt(f"{path}: manifest_sha256 does not match its contents")
    version = body.get("format_version")
    if type(version) is not int or version not in (*MIGRATED, FORMAT_VERSION):
        readable = " and ".join(str(v) for v in (*MIGRATED, FORMAT_VERSION))
        raise CheckpointIncompatible(
            f"{path}: format_version {version!r}; this build reads format_version {readable} "
            f"(writes {FORMAT_VERSION})"
        )
    _check_manifest(body, path)
    if version >= 3 and LEDGER not in body["files"]:
        raise CheckpointCorrupt(f"{path}: does not list {LEDGER}")
    return body


def _check_listing(directory: Path, manifest: Mapping[str, Any]) -> None:
    """CheckpointCorrupt if the directory holds a file the manifest does not list."""
    extra = sorted(set(os.listdir(directory)) - set(manifest["files"]) - {MANIFEST})
    if extra:
        raise CheckpointCorrupt(f"{directory}: files not in the manifest: {extra}")


def _info(directory: Path, manifest: Mapping[str, Any]) -> CheckpointInfo:
    size = sum(entry["bytes"] for entry in manifest["files"].values())
    return CheckpointInfo(
        name=directory.name,
        global_step=manifest["global_step"],
        path=directory,
        size_bytes=size + (directory / MANIFEST).stat().st_size,
        save_ms=manifest.get("save_ms"),
        created_unix=float(manifest["created_unix"]),
        commit_sequence=manifest.get("commit_sequence", 0),
    )


# ------------------------------------------------------------------------------ save
def without_replay(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`state` (Trainer.state_dict) with an empty replay buffer: no rows, its position and
    size 0. A trainer restored from it refills the buffer before its C51 head trains again."""
    emptied = {}
    for key, array in state.items():
        if key in ("replay/position", "replay/size"):
            array = np.zeros_like(array)
        elif key.startswith("replay/"):
            array = array[:0]
        emptied[key] = array
    return emptied


def _state_files(
    trainer: Trainer, ledger: StepLedger, job: Mapping[str, np.ndarray] | None, replay: bool
) -> dict[str, bytes]:
    """The serialized files of a trainer: `<group>.safetensors` per state group (the replay
    buffer emptied unless `replay`), config.json, ledger.json, and job.safetensors with
    `job`."""
    groups: dict[str, dict[str, np.ndarray]] = {}
    state = trainer.state_dict()
    for key, array in (state if replay else without_replay(state)).items():
        group, _, rest = key.partition("/")
        groups.setdefault(group, {})[rest] = np.ascontiguousarray(array)
    files = {f"{group}.safetensors": save_tensors(tensors) for group, tensors in groups.items()}
    config = json.dumps(trainer.config.public_dict(), sort_keys=True, indent=1) + "\n"
    files[CONFIG] = config.encode()
    files[LEDGER] = ledger.to_json()
    if job is not None:
        files[JOB] = save_tensors({k: np.ascontiguousarray(v) for k, v in job.items()})
    return files


def _commit(temp: Path, target: Path) -> None:
    """Rename a fully written temporary directory into place and make the rename durable."""
    _fsync_dir(temp)
    try:
        os.rename(temp, target)
    except OSError as error:  # a concurrent save of the same name won the race
        raise InvalidInput(
            "name",
            "a name no checkpoint has (checkpoints are immutable)",
            f"{target.name!r} ({error.strerror})",
        ) from None
    _fsync_dir(target.parent)


def save_checkpoint(
    trainer: Trainer,
    root: PathLike,
    name: str | None = None,
    keep_last: int | None = None,
    ledger: StepLedger | None = None,
    job: Mapping[str, np.ndarray] | None = None,
    replay: bool = True,
) -> CheckpointInfo:
    """Write the trainer's whole state as checkpoint `name` (default `step-<global_step>`),
    with `ledger` (a server's keys of the Steps in that state; empty for a job) and `job` (a
    training job's own arrays: `read_job_state`), then prune to the newest `keep_last`
    (default `checkpoint.keep_last`). Without `replay` the replay buffer is saved empty (a
    finished job's last checkpoint: nothing trains on it again, and the buffer is most of a
    checkpoint's bytes)."""
    started = time.perf_counter()
    name = check_name(f"step-{trainer.global_step:010d}" if name is None else name)
    keep = trainer.config.checkpoint.keep_last if keep_last is None else keep_last
    if type(keep) is not int or keep < 1:
        raise InvalidInput("keep_last", "an integer >= 1", repr(keep))
    root = Path(root)
    target = root / name
    if os.path.lexists(target):
        raise InvalidInput(
            "name", "a name no checkpoint has (checkpoints are immutable)", repr(name)
        )
    if ledger is None:
        ledger = StepLedger(trainer.config.server.step_key_window)
    state = _state_files(trainer, ledger, job, replay)  # in memory: what the save will write
    temp = root / f"{TEMP_PREFIX}{name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        temp.mkdir()
        files = {fn: _write_file(temp / fn, data) for fn, data in state.items()}
        manifest = {
            "format_version": FORMAT_VERSION,
            "global_step": trainer.global_step,
            "param_digest": trainer.param_digest(),
            "backend": trainer.backend.name,
            "files": files,
            "save_ms": round((time.perf_counter() - started) * 1000, 3),
        }
        with _commit_lock(root):
            newest = latest_checkpoint(root)
            manifest["commit_sequence"] = 1 + (newest.commit_sequence if newest else 0)
            manifest["created_unix"] = time.time()
            _write_file(temp / MANIFEST, _seal(manifest))
            _commit(temp, target)
    except BaseException as error:
        shutil.rmtree(temp, ignore_errors=True)
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            needed = sum(len(data) for data in state.values())
            raise _disk_full(root, name, needed, error) from error
        raise
    prune(root, keep, protect=name)
    return _info(target, manifest)


def _disk_full(root: Path, name: str, needed: int, error: OSError) -> CheckpointDiskFull:
    """CheckpointDiskFull naming the directory, the bytes the checkpoint needed and those free
    there (measured after the partial save was removed)."""
    try:
        free: int | None = shutil.disk_usage(root).free
    except OSError:
        free = None
    room = "" if free is None else f", {free} bytes free there"
    return CheckpointDiskFull(
        f"checkpoint {name!r}: no room in the checkpoint directory {os.fspath(root)} "
        f"({error.strerror or error}): it needs {needed} bytes (and a manifest){room}; nothing "
        "was committed (free space on that volume, or lower checkpoint.keep_last)"
    )


@contextlib.contextmanager
def _commit_lock(root: Path) -> Iterator[None]:
    """Hold the root's commit lock (an exclusive flock): one commit sequence per commit, also
    between processes saving into the same root."""
    fd = os.open(root / COMMIT_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


# ------------------------------------------------------------------------------ listing
@dataclass(frozen=True)
class Invalid:
    """A directory under a checkpoint root that looks like a checkpoint (a checkpoint's name)
    but does not validate, and why."""

    name: str
    reason: str


def survey_checkpoints(root: PathLike) -> tuple[list[CheckpointInfo], list[Invalid]]:
    """The committed checkpoints under `root`, newest first (as `list_checkpoints`), and the
    directories with a checkpoint's name that are not (no manifest, a manifest that does not
    validate or that this build does not read), by name. Temporaries are neither."""
    root = Path(root)
    if not root.is_dir():
        return [], []
    found, invalid = [], []
    for entry in os.scandir(root):
        if not entry.is_dir(follow_symlinks=False) or not _is_name(entry.name):
            continue
        directory = root / entry.name
        try:
            found.append(_info(directory, read_manifest(directory)))
        except CheckpointNotFound:
            invalid.append(Invalid(entry.name, f"{directory / MANIFEST}: missing"))
        except (CheckpointCorrupt, CheckpointIncompatible) as error:
            invalid.append(Invalid(entry.name, str(error)))
        except OSError as error:
            invalid.append(Invalid(entry.name, f"{directory}: unreadable ({error})"))
    found.sort(key=lambda c: (c.commit_sequence, c.created_unix, c.name), reverse=True)
    return found, sorted(invalid, key=lambda i: i.name)


def list_checkpoints(root: PathLike) -> list[CheckpointInfo]:
    """Committed checkpoints under `root`, newest first: the one committed last first (by
    commit sequence; checkpoints that record none come after, by creation time).

    Temporary directories and anything without a valid manifest are ignored.
    """
    return survey_checkpoints(root)[0]


def latest_checkpoint(root: PathLike) -> CheckpointInfo | None:
    """The newest committed checkpoint, or None."""
    checkpoints = list_checkpoints(root)
    return checkpoints[0] if checkpoints else None


def resumable(
    root: PathLike, fresh_if_invalid: bool = False
) -> tuple[CheckpointInfo | None, list[Invalid]]:
    """What a resume restores: the newest checkpoint whose manifest validates (None when
    `root` holds no checkpoint at all), and the checkpoints it passed over as invalid, for the
    caller to warn about. When checkpoints exist but none validates, NoValidCheckpoint naming
    each and why: a fresh start there would abandon their line (and its drain would commit a
    new one over it); `fresh_if_invalid` starts fresh anyway (None, with the invalid ones)."""
    found, invalid = survey_checkpoints(root)
    if found or not invalid or fresh_if_invalid:
        return (found[0] if found else None), invalid
    raise NoValidCheckpoint(
        f"resume: no valid checkpoint in {os.fspath(root)}, and {len(invalid)} that do not "
        "validate: " + "; ".join(f"{i.name}: {i.reason}" for i in invalid)
        + ". Expected one to restore; repair or move them aside, restore one by name, or set "
        "checkpoint.fresh_if_invalid = true to start fresh beside them"
    )


def _remove(root: Path, name: str) -> None:
    """Delete a checkpoint: first rename it out of sight (atomic), then remove the files."""
    doomed = root / f"{TEMP_PREFIX}{name}-{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(root / name, doomed)
    _fsync_dir(root)
    shutil.rmtree(doomed, ignore_errors=True)


def prune(root: PathLike, keep_last: int, protect: str | None = None) -> list[str]:
    """Delete all but the newest `keep_last` checkpoints (counting `protect`, never deleted)."""
    root = Path(root)
    others = [c.name for c in list_checkpoints(root) if c.name != protect]
    doomed = others[keep_last - 1 :] if protect is not None else others[keep_last:]
    for name in doomed:
        _remove(root, name)
    return doomed


def clean_temporaries(root: PathLike) -> int:
    """Remove the `.tmp-*` leftovers of interrupted saves and prunes; how many were removed.

    Call at start-up, before any save runs against `root`.
    """
    root = Path(root)
    if not root.is_dir():
        return 0
    removed = 0
    for entry in os.scandir(root):
        if entry.name.startswith(TEMP_PREFIX):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
            removed += 1
    return removed


# ------------------------------------------------------------------------------ restore
def _parse_tensors(directory: Path, filename: str, data: bytes) -> dict[str, np.ndarray]:
    try:
        return load_tensors(data)
    except (SafetensorError, ValueError) as error:
        path = directory / filename
        raise CheckpointCorrupt(f"{path}: not a safetensors file ({error})") from None


def _checkpoint_config(directory: Path, data: bytes) -> Config:
    try:
        return Config.from_dict(json.loads(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointCorrupt(f"{directory / CONFIG}: not valid JSON ({error})") from None
    except ConfigError as error:
        raise CheckpointIncompatible(
            f"{directory / CONFIG}: not a config this build reads ({error})"
        ) from None


def _setting(config: Config, key: str) -> Any:
    section, _, field = key.partition(".")
    return getattr(getattr(config, section), field)


def check_compatible(saved: Config, mine: Config, name: str) -> None:
    """CheckpointIncompatible naming every shape-defining setting that differs."""
    model_keys = [f"model.{k}" for k in saved.to_dict()["model"]]
    differing = [
        f"{key}: checkpoint {_setting(saved, key)!r}, trainer {_setting(mine, key)!r}"
        for key in (*model_keys, *COMPATIBLE_KEYS)
        if _setting(saved, key) != _setting(mine, key)
    ]
    if differing:
        raise CheckpointIncompatible(
            f"checkpoint {name!r} does not fit this trainer: " + "; ".join(differing)
        )


def _load_state(
    directory: Path, manifest: Mapping[str, Any], blobs: Mapping[str, bytes]
) -> dict[str, np.ndarray]:
    """The full `group/key` state dict from the verified safetensors files."""
    state: dict[str, np.ndarray] = {}
    for filename in manifest["files"]:
        if filename.endswith(".safetensors") and filename != JOB:
            group = filename.removesuffix(".safetensors")
            tensors = _parse_tensors(directory, filename, blobs[filename])
            state.update({f"{group}/{key}": array for key, array in tensors.items()})
    return state


def _apply(
    trainer: Trainer,
    state: Mapping[str, np.ndarray],
    hot: Mapping[str, Any],
    expected_digest: str,
    name: str,
) -> None:
    """Load state and hot settings into the trainer; on any failure put everything back."""
    saved_state = {key: array.copy() for key, array in trainer.state_dict().items()}
    saved_hot = {key: _setting(trainer.config, key) for key in HOT_KEYS}
    try:
        try:
            trainer.load_state_dict(state)
        except InvalidInput as error:
            raise CheckpointCorrupt(f"checkpoint {name!r}: tensors do not fit ({error})") from None
        trainer.update_hyperparams(hot)
        digest = trainer.param_digest()
        if digest != expected_digest:
            raise CheckpointCorrupt(
                f"checkpoint {name!r}: parameter digest {digest} does not "
                f"match the manifest's {expected_digest}"
            )
    except BaseException:
        trainer.load_state_dict(saved_state)
        trainer.update_hyperparams(saved_hot)  # the config and the values the update reads
        raise


def _ledger(directory: Path, blobs: Mapping[str, bytes], capacity: int) -> StepLedger:
    """The checkpoint's ledger; a version-2 checkpoint has none: an empty one."""
    if LEDGER not in blobs:
        return StepLedger(capacity)
    try:
        return StepLedger.from_json(blobs[LEDGER], capacity)
    except (ValueError, TypeError, KeyError, AttributeError, InvalidInput) as error:
        raise CheckpointCorrupt(f"{directory / LEDGER}: malformed ({error})") from None


def restore_checkpoint(
    trainer: Trainer, root: PathLike, name: str, ledger: StepLedger | None = None
) -> CheckpointInfo:
    """Replace the trainer's state (and hot settings) with checkpoint `name`, and `ledger`'s
    keys with the checkpoint's, all or nothing."""
    directory = _committed_dir(root, name)
    manifest = read_manifest(directory)
    _check_listing(directory, manifest)
    blobs = {fn: _read_verified(directory, fn, entry) for fn, entry in manifest["files"].items()}
    saved = _checkpoint_config(directory, blobs[CONFIG])
    check_compatible(saved, trainer.config, name)
    hot = {key: _setting(saved, key) for key in HOT_KEYS}
    state = _load_state(directory, manifest, blobs)
    saved_ledger = _ledger(directory, blobs, trainer.config.server.step_key_window)
    _apply(trainer, state, hot, manifest["param_digest"], name)
    if ledger is not None:
        ledger.adopt(saved_ledger)
    return _info(directory, manifest)


def read_job_state(root: PathLike, name: str) -> dict[str, np.ndarray] | None:
    """The training job's arrays checkpoint `name` holds (verified against its manifest);
    None for a checkpoint without (a server's, or one written before jobs saved theirs)."""
    directory = _committed_dir(root, name)
    manifest = read_manifest(directory)
    entry = manifest["files"].get(JOB)
    if entry is None:
        return None
    return _parse_tensors(directory, JOB, _read_verified(directory, JOB, entry))


def load_policy(root: PathLike, name: str) -> tuple[Config, dict[str, np.ndarray]]:
    """The verified config and parameters of checkpoint `name`: all an inference-only server
    needs, without reading optimizer state or the replay buffer."""
    directory = _committed_dir(root, name)
    manifest = read_manifest(directory)
    blobs = {}
    for filename in (CONFIG, "params.safetensors"):
        if filename not in manifest["files"]:
            raise CheckpointCorrupt(f"{directory / MANIFEST}: does not list {filename}")
        blobs[filename] = _read_verified(directory, filename, manifest["files"][filename])
    config = _checkpoint_config(directory, blobs[CONFIG])
    return config, _parse_tensors(directory, "params.safetensors", blobs["params.safetensors"])
