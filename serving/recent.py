"""What `GET /view` of the reward server shows: the last checked traces, bounded."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from typing import Any

from stepgap.reward_arithmetic import RewardResult
from stepgap.schema import Trace, Verdict


class RecentTraces:
    """The last `keep` checked traces with their verdicts (and rewards, from the reward routes):
    what `GET /view` shows. Each is kept as the page draws it (`stepgap.eval.view_data.trace_view`:
    steps, evidence, verdicts, answer and EM; not the raw response) in a deque of at most `keep`,
    so a long-running server holds a bounded amount; older traces are dropped as new ones come.
    `on_failed_check` is the server's, so the page shows the rewards it answered."""

    def __init__(self, keep: int = 100, on_failed_check: str = "no_reward") -> None:
        if keep < 0:
            raise ValueError(f"view_keep must be >= 0, got {keep}")
        self.items: deque[dict[str, Any]] = deque(maxlen=keep)
        self.on_failed_check = on_failed_check
        self._seq = itertools.count(1)

    def add(self, trace: Trace, verdicts: Sequence[Verdict], result: RewardResult | None) -> None:
        from stepgap.eval.view_data import RewardLine, trace_view

        if self.items.maxlen == 0:
            return
        # Rollouts of different requests share ids (`reward-0`): number them so they stay apart.
        tid = f"#{next(self._seq)} {trace.id}"
        self.items.append(
            trace_view(
                trace.model_copy(update={"id": tid}),
                {"served": [v.model_copy(update={"trace_id": tid}) for v in verdicts]},
                reward=(
                    None
                    if result is None
                    else RewardLine.model_validate({**result.as_dict(), "trace_id": tid})
                ),
                on_failed_check=self.on_failed_check,
            )
        )

    def __len__(self) -> int:
        return len(self.items)

    def render(self) -> str:
        """The page (`stepgap.eval.view_page.render_html`), newest trace first."""
        from stepgap.eval.view_data import page_data
        from stepgap.eval.view_page import render_html

        items = list(reversed(self.items))
        title = f"stepgap serve: the last {len(items)} checked traces (of at most "
        return render_html(page_data(items, ["served"], title=f"{title}{self.items.maxlen})"))
