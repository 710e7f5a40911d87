"""A job's progress (service/jobs/progress.py): a bar with Steps/s and ETA on a terminal, the
log lines alone anywhere else."""

from __future__ import annotations

import io

from service.jobs.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(stream: io.StringIO) -> str:
    with Progress(4, done=1, stream=stream) as progress:
        for step in range(2, 5):
            progress.step(f"reward {step}")
            if step % 2 == 0:
                progress.log(f"step {step}/4")
    return stream.getvalue()


def test_a_terminal_gets_a_bar_with_rate_and_eta() -> None:
    out = run(Terminal())
    assert "\r" in out and "Step/s" in out and "reward 4" in out
    assert "| 4/4 [" in out and "<" in out  # elapsed<remaining
    assert "step 2/4\n" in out and "step 4/4\n" in out


def test_a_file_gets_the_log_lines_alone() -> None:
    assert run(io.StringIO()) == "step 2/4\nstep 4/4\n"
