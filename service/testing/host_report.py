"""What a benchmark's JSON records about the machine it ran on, shared by the bench scripts:
the platform, the installed versions, the commit, and the CPU time the machine spent."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout whose `service` runs


def machine() -> dict[str, Any]:
    """Platform, CPU model and count (and the usable ones), memory, Python version."""
    model = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, ValueError):
        info["memory_gb"] = round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1
        )
    return info


def versions(packages: Iterable[str]) -> dict[str, Any]:
    """Each installed distribution's version (None when absent) and `git_commit`."""
    found: dict[str, Any] = {}
    for name in packages:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    found["git_commit"] = git_commit()
    return found


def write_record(out: Path, script: str, packages: Iterable[str], fields: dict[str, Any]) -> None:
    """A bench's JSON at `out`: the command that ran `script`, the UTC date, the machine, the
    versions of `packages` (and the commit), then `fields`."""
    record = {
        "command": shlex.join(["python3", script, *sys.argv[1:]]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(packages),
        **fields,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")


def git_commit() -> str | None:
    """HEAD, with "-dirty" when tracked files differ from it (a copied tree whose .git is older
    than the files, as on a device that receives the working tree, shows up that way)."""

    def git(*args: str) -> str:
        command = ["git", *args]
        out = subprocess.run(command, capture_output=True, text=True, timeout=5, cwd=REPO_ROOT)
        return out.stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if head and dirty else head or None


def cpu_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine so far (all cores, from /proc/stat)."""
    with contextlib.suppress(OSError, ValueError):
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    return None


def own_cpu_s() -> float:
    """CPU seconds of this process and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
