"""README.md and deploy/README.md run as written, in order, on a fresh copy of this tree.

The slow test copies what a clone holds, makes a virtual environment that sees this machine's
packages (so `pip install .` installs Trident alone), and runs every shell and Python block
that needs nothing outside the machine, ports and paths as written. It also checks what the
first command promises: the main job's agent beats every baseline but the inventory-skew rule
on held-out markets (measured: it beats the other three on every seed tried; against the skew
rule it wins on three seeds of seven and ties on four, docs/benchmarks/learning.md, a margin
that another CPU's arithmetic can move, so it is not asserted here).
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from readme_shell import Block, Session, blocks, tracked_files

from service.testing.serverproc import clean_env

ROOT = Path(__file__).resolve().parents[2]
READMES = (ROOT / "README.md", ROOT / "deploy" / "README.md")
# Commands a README shows that this test does not run, each with why.
NOT_RUN = {
    "pip install -e '.[test]' && python -m pytest -q -n 2": "the suite itself: .ci/run runs it",
}
# The main job runs in its own shell, as a reader would leave it training while trying the
# rest; it must exit 0 by the end. (Its install must finish before the next command runs.)
MAIN_JOB = "pip install . && trident train"
COMMAND_TIMEOUT_S = 600.0
SKEW = "inventory-skew"


def all_blocks() -> list[Block]:
    return [block for readme in READMES for block in blocks(readme)]


def test_each_block_runs_here_or_names_what_it_needs() -> None:
    """Every block of README.md runs in CI; every block of deploy/README.md names Docker, a
    cluster or a GPU host (a new block there that runs here would be run by the slow test)."""
    readme, deploy = ({block.where: block.needs() for block in blocks(path)} for path in READMES)
    assert readme and all(need is None for need in readme.values()), readme
    assert len(deploy) >= 5 and all(need is not None for need in deploy.values()), deploy


def test_the_commands_left_out_are_shown_and_run_elsewhere() -> None:
    commands = {c for block in all_blocks() if block.language == "shell" for c in block.commands()}
    shown = {c.split("#")[0].strip() for c in commands}
    assert set(NOT_RUN) <= shown, set(NOT_RUN) - shown
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-e '.[test]'" in ci and "\npython3 -m pytest -q -n 2\n" in ci


@pytest.mark.slow
def test_the_readmes_run_as_written(tmp_path: Path) -> None:
    clone, venv, logs = tmp_path / "trident", tmp_path / "venv", tmp_path / "logs"
    for name in tracked_files(ROOT):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, clone / name)
    logs.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = clean_env()
    env.pop("PYTHONPATH", None)
    env |= {"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}:{env['PATH']}"}
    session = Session(clone, env, logs)
    try:
        for block in all_blocks():
            if block.needs() is not None:
                continue
            if block.language == "python":
                session.run_python(block.text, COMMAND_TIMEOUT_S)
                continue
            for command in block.commands():
                bare = command.split("#")[0].strip()
                if bare == MAIN_JOB:
                    session.start(command, lambda: installed(venv), "Trident installed")
                elif bare not in NOT_RUN:
                    session.run(command, COMMAND_TIMEOUT_S)
        where = session.run("cd / && python -c 'import service; print(service.__file__)'", 60)
        session.finish_jobs(COMMAND_TIMEOUT_S)
    finally:
        exits = session.stop()
        (logs / "transcript.txt").write_text("\n".join(session.transcript))
    assert Path(where.strip()).is_relative_to(venv), f"Trident ran from {where}, not the venv"
    assert exits and all(code == 0 for code in exits.values()), exits  # servers drained
    main_job = min((clone / "runs").glob("lobsim-*"))  # the first `trident train`
    paired = json.loads((main_job / "eval.json").read_text())["paired"]
    verdicts = {baseline: result["verdict"] for baseline, result in paired.items()}
    assert set(verdicts) == {"hold", "random", "quote(0,0)", SKEW, "avellaneda-stoikov"}
    assert all(v == "better" for b, v in verdicts.items() if b != SKEW), verdicts


def installed(venv: Path) -> bool:
    """Whether `pip install .` has finished in `venv`: the entry point is there, and the
    installed files' RECORD, which pip writes last."""
    records = (venv / "lib").glob("python3*/site-packages/trident-*.dist-info/RECORD")
    return (venv / "bin" / "trident").exists() and any(records)


def test_the_tests_the_readme_and_the_docs_name_exist() -> None:
    """Every `tests/...py` file and `file.py::test_name` the README or a docs page cites (the
    operations page's Reliability section names one per guarantee) exists; a bare `test_x.py`
    is looked for under tests/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    text = "\n".join(page.read_text() for page in pages if "_build" not in page.parts)
    cited = re.findall(r"`((?:tests/[\w/]+/)?test_\w+\.py)(?:::(\w+))?`", text)
    assert len(cited) >= 10, cited
    for path, name in cited:
        found = [ROOT / path] if "/" in path else sorted((ROOT / "tests").rglob(path))
        found = [candidate for candidate in found if candidate.is_file()]
        assert found, f"the docs cite {path}, which does not exist"
        if name:
            assert re.search(rf"^def {name}\(", found[0].read_text(), re.M), f"{path}::{name}"


# Where a README command writes, by its flag (a folder ends with "/"); a command that leaves
# the flag out writes its default.
WRITES = {"--checkpoint-dir": "/", "--run-dir": "/", "--out": "", "--out-dir": "/"}
DEFAULT_WRITES = {"train": "runs/x/", "serve": "runs/serve-50051/checkpoints/", "eval": "eval/"}


def written_paths(command: str) -> set[str]:
    """The paths, relative to the checkout, that a README command writes into."""
    words = shlex.split(command, comments=True)
    paths = {value.rstrip("/") + WRITES[flag]
             for flag, value in itertools.pairwise(words) if flag in WRITES}  # fmt: skip
    paths |= set(re.findall(r"np\.save\('([^']+)'", command))
    if words[:1] == ["trident"] and len(words) > 1 and words[1] in DEFAULT_WRITES:
        flag = {"train": "--run-dir", "serve": "--checkpoint-dir", "eval": "--out-dir"}[words[1]]
        if flag not in words:
            paths.add(DEFAULT_WRITES[words[1]])
    return paths


def test_what_the_readme_commands_write_is_ignored_by_git() -> None:
    """A reader who runs the README's commands in a clone finds `git status` clean: every
    checkpoint directory, run folder and output file they write is in .gitignore."""
    commands = [c.split("#")[0] for block in blocks(ROOT / "README.md")
                if block.language == "shell" for c in block.commands()]  # fmt: skip
    paths = set().union(*(written_paths(command) for command in commands))
    assert {"ckpt/", "ckpt-js/", "obs.npy", "policy.onnx", "runs/bandit/"} <= paths, paths
    check = ["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *sorted(paths)]
    checked = subprocess.run(check, cwd=ROOT, capture_output=True, text=True)
    unignored = [line.split("\t")[-1] for line in checked.stdout.splitlines()
                 if line.startswith("::")]  # fmt: skip
    assert not unignored, f"README commands write {unignored}, which git does not ignore"
