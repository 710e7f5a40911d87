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


def phased(stream: io.StringIO) -> str:
    """Two parts of 3 and 2 units; the second does one unit fewer than it counted for."""
    from service.jobs.progress import Phases

    with Phases("evaluation", 5, 2, stream=stream) as phases:
        for _ in range(3):
            phases.advance(1)
        phases.end("first played 3")
        phases.advance(1)
        phases.end("second played 2", units=5)
    return stream.getvalue()


def test_phases_print_a_line_per_part_with_the_units_done() -> None:
    lines = phased(io.StringIO()).splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "evaluation 1/2: first played 3",
        "evaluation 2/2: second played 2",
    ]
    assert "(3/5 episodes, " in lines[0] and "(5/5 episodes, " in lines[1]
    assert all(line.endswith(" s left)") for line in lines)


def test_phases_on_a_terminal_show_a_bar_with_rate_and_eta() -> None:
    out = phased(Terminal())
    assert "\r" in out and "episode/s" in out and "| 5/5 [" in out
    assert "evaluation 2/2: second played 2 (5/5 episodes" in out


def test_episodes_since_the_last_line_add_up() -> None:
    from service.jobs.progress import Episodes

    tally = Episodes()
    assert tally.text() == "no episode ended"
    tally.add(2, 3.0)
    tally.add(0, 0.0)
    tally.add(1, 6.0)
    assert tally.text() == "episode return 3.00 (3 ended)"
    assert tally.take() == (3, 9.0) and tally.take() == (0, 0.0)
