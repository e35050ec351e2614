"""stepgap.progress: a bar on a terminal, plain lines in a log, closed before an error goes on."""

from __future__ import annotations

import io

import pytest

from stepgap.progress import LOG_INTERVAL, LogLines, progress_bar
from tests.fixtures.clock import ManualClock


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_log_the_counts_are_lines_at_the_start_every_interval_and_at_the_end():
    """A log gets `done/total, elapsed, time left` as lines, never a redrawn bar: the first as
    the work starts (the first step of a local judge may take minutes), then one per
    `LOG_INTERVAL` however many updates come, and the last count."""
    log, clock = io.StringIO(), ManualClock(start=0.0)
    with progress_bar(8, "check", file=log, clock=clock.now) as bar:
        clock.advance(100)
        bar.update(1)  # written: the interval has passed
        clock.advance(LOG_INTERVAL / 2)
        bar.update(1)  # not written: too soon after the last line
        clock.advance(150 - LOG_INTERVAL / 2)
        bar.update(3)
        clock.advance(10)
        bar.update(2)  # not written, until the bar closes
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == [
        "check: 0/8 steps, 00:00 elapsed",
        "check: 1/8 steps, 01:40 elapsed, about 11:40 left",
        "check: 5/8 steps, 04:10 elapsed, about 02:30 left",
        "check: 7/8 steps, 04:20 elapsed, about 00:37 left",
    ]


def test_a_log_line_without_a_total_counts_alone_and_keeps_the_postfix():
    log, clock = io.StringIO(), ManualClock(start=0.0)
    with progress_bar(None, "rollouts", "trace", file=log, clock=clock.now) as bar:
        clock.advance(LOG_INTERVAL)
        bar.set_postfix(searches=4, refresh=False)
        bar.update(2)
    assert log.getvalue().splitlines() == [
        "rollouts: 0 traces, 00:00 elapsed",
        "rollouts: 2 traces, 00:30 elapsed, searches=4",
    ]


def test_an_error_inside_closes_the_bar_first_so_nothing_is_written_after_it():
    """Ctrl-C: the last count is written as the `with` ends, before the command says
    `interrupted`; the bar, closed, writes nothing more when it is collected."""
    log = io.StringIO()
    with pytest.raises(KeyboardInterrupt), progress_bar(5, "label", file=log) as bar:
        bar.update(2)
        raise KeyboardInterrupt
    print("stepgap label: interrupted", file=log)
    del bar
    assert log.getvalue().splitlines()[-1] == "stepgap label: interrupted"
    assert log.getvalue().splitlines()[-2].startswith("label: 2/5 steps")


def test_on_a_terminal_it_is_tqdms_bar_and_off_it_shows_nothing():
    screen = Terminal()
    with progress_bar(4, "check", file=screen) as bar:
        bar.update(4)
    assert not isinstance(bar, LogLines)
    assert "\r" in screen.getvalue() and "4/4" in screen.getvalue()
    quiet = io.StringIO()
    for bar in (
        progress_bar(4, "check", file=quiet, enabled=False),
        progress_bar(0, "label", file=quiet),  # nothing to do: no "0/0"
    ):
        with bar:
            bar.update(0)
    assert quiet.getvalue() == ""
