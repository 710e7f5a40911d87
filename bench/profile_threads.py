"""Where each server thread's wall time goes, from a py-spy raw profile of every thread.

Record the learner and its front ends together, idle samples included (a thread waiting
shows where it waits):

    py-spy record --pid SERVER_PID --subprocesses --idle --threads --rate 100 \
        --duration 12 --format raw --nonblocking -o prof.txt
    python3 bench/profile_threads.py prof.txt [--top 8]

Prints, per process (the learner, front end i) and thread name (numbered pool threads pooled),
its samples and the share of each place it was in: for an Interact handler thread the call
in `_interact`'s loop it was in (waiting for the client's next request, the Act's answer,
room in the Step queue, or decoding), for the others the innermost frame of this repository.
Reads .gz as well.
"""

from __future__ import annotations

import argparse
import gzip
import re
from collections import Counter, defaultdict
from pathlib import Path

HANDLER_LOOP = "_interact (service/server/servicer.py"


def place(frames: list[str]) -> str:
    """The call in the Interact handler's loop, else the innermost frame of the service."""
    for i, frame in enumerate(frames):
        if HANDLER_LOOP in frame:
            line = frame.rsplit(":", 1)[-1].rstrip(")")
            callee = frames[i + 1].split(" (")[0] if i + 1 < len(frames) else "itself"
            return f"Interact loop line {line}: {callee}"
    ours = [frame for frame in frames if "service/" in frame]
    return (ours[-1] if ours else frames[-1])[:110]


def split(path: Path) -> tuple[dict[tuple[str, str], Counter[str]], Counter[tuple[str, str]]]:
    opener = gzip.open if path.suffix == ".gz" else open
    places: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    totals: Counter[tuple[str, str]] = Counter()
    with opener(path, "rt") as lines:
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            frames = stack.split(";")
            process = "learner"
            if len(frames) > 1 and frames[1].startswith("process "):  # a child's own frame
                index = re.search(r"--index (\d+)", frames[1])
                process = f"front end {index.group(1) if index else '?'}"
                frames = frames[1:]
            named = re.search(r"thread \((?:0x)?[0-9a-f]+\): ?(.*)", frames[1]) if len(
                frames) > 1 else None  # fmt: skip
            thread = re.sub(r"[-_]\d+$", "", named.group(1) if named else "?") or "?"
            places[(process, thread)][place(frames)] += int(count)
            totals[(process, thread)] += int(count)
    return places, totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="py-spy --format raw output (or .gz)")
    parser.add_argument("--top", type=int, default=8, help="places shown per thread")
    args = parser.parse_args()
    places, totals = split(args.profile)
    for key, total in totals.most_common():
        print(f"\n{key[0]} / {key[1]}: {total} samples")
        for where, n in places[key].most_common(args.top):
            print(f"  {100 * n / total:5.1f}%  {where}")


if __name__ == "__main__":
    main()
