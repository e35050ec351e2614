"""The progress of a command's long work (judging steps, rolling out traces, indexing
documents): one bar for every command, on a terminal or in a log.

On a terminal it is tqdm's bar: done/total, elapsed, time left and speed, redrawn in place.
Anywhere else (a log file, a pipe, CI) a redrawn bar is either nothing at all or one line
rewritten with carriage returns, so the same counts are written as plain lines instead: one as
the work starts, so the total is seen before the first (perhaps long) step ends, then at most
one every `LOG_INTERVAL` seconds, and the last count at the end:

    check: 3/8 steps, 04:10 elapsed, about 06:50 left

Every bar is a context manager: a command closes it in a `with`, so on Ctrl-C its last line is
written before the command's `interrupted` line, never after it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from tqdm.auto import tqdm
from tqdm.std import tqdm as plain_tqdm

LOG_INTERVAL = 30.0
"""Seconds between two lines of a bar in a log (a job of an hour: about 120 lines)."""


class LogLines(plain_tqdm):
    """tqdm's bar as a line per update, for a log: no carriage returns, no bar, no width.
    The time left is from the average speed since the start, as the lines are far apart.
    `clock` (seconds) replaces the machine's, for a test."""

    def __init__(self, *args: Any, clock: Callable[[], float] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if clock is not None and not self.disable:
            self._time = clock
            self.start_t = self.last_print_t = clock()

    @property
    def format_dict(self) -> dict[str, Any]:
        counts = super().format_dict
        done, elapsed, total = self.n - self.initial, counts["elapsed"], self.total
        left = ""
        if total and 0 < done and self.n < total and elapsed > 0:
            left = f", about {self.format_interval((total - self.n) * elapsed / done)} left"
        return {**counts, "ncols": None, "left": left}  # ncols None: the line is never cut

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg == "":  # tqdm clearing the bar as it closes: a log has nothing to clear
            return False
        print(self.__str__() if msg is None else msg, file=self.fp, flush=True)
        return True

    def close(self) -> None:
        if not self.disable and self.n != self.last_print_n:
            self.display()  # the last count, when its update was not written
        super().close()


def _log_format(total: int | None) -> str:
    done = "{n_fmt}/{total_fmt}" if total is not None else "{n_fmt}"
    return "{desc}: " + done + " {unit}s, {elapsed} elapsed{left}{postfix}"


def progress_bar(
    total: int | None,
    desc: str,
    unit: str = "step",
    *,
    enabled: bool = True,
    file: TextIO | None = None,
    clock: Callable[[], float] | None = None,
) -> tqdm:
    """The bar of `total` `unit`s of work named `desc` (None: a total not known), shown on
    `file` (stderr): a tqdm bar on a terminal, else `LogLines`. Nothing is shown when not
    `enabled` (`--no-progress`) or when there is nothing to do (`total` 0). `clock`: a test's
    seconds, for the lines of a log."""
    file = file if file is not None else sys.stderr
    if not enabled or total == 0:
        return tqdm(total=total, disable=True)
    if file.isatty():
        return tqdm(total=total, desc=desc, unit=unit, file=file, dynamic_ncols=True)
    return LogLines(
        total=total,
        desc=desc,
        unit=unit,
        file=file,
        bar_format=_log_format(total),
        mininterval=LOG_INTERVAL,
        miniters=1,  # no tqdm monitor thread writing lines of its own
        smoothing=0,  # the average speed since the start
        leave=False,  # `close` writes the last count; tqdm's own would add a blank line
        clock=clock,
    )
