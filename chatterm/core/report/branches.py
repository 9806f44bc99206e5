"""The branches section of the Markdown and HTML reports: which branch each turn
is on, for a session that has more than one line.

Contract:
- `has_branches(report)`: a turn has alternatives (a regenerated reply, an
  edited message), is off the main line, or was inherited from the session
  this one was forked from. A session of one line gets no section, so its
  report is as it was.
- `branch_rows(report, escape)`: one row per turn, in index order, under
  `BRANCH_HEADER`: its branch ("main", or "b<N>": the branch turn N started),
  the turn before it on its path, its place among its alternatives ("2/3")
  and whether it was inherited. Every cell goes through `escape`.
- `fork_sentence(report)`: where a forked session came from, else None.
"""

from __future__ import annotations

from typing import Callable

from chatterm.core.report.figures import SessionReport
from chatterm.core.store.records import MAIN_BRANCH

BRANCH_HEADER = ("#", "branch", "after turn", "alternative", "inherited")
BRANCH_NOTE = (
    "A regenerated reply or an edited message is an alternative of the turn it replaces: "
    "both are kept, each with its own timings and cost."
)


def has_branches(r: SessionReport) -> bool:
    return any(
        v.record.branch != MAIN_BRANCH or v.record.siblings > 1 or v.record.inherited for v in r.turns
    )


def branch_rows(r: SessionReport, escape: Callable[[str], str]) -> list[list[str]]:
    return [
        [escape(str(v.index)), escape(v.record.branch),
         escape("–" if v.record.parent is None else str(v.record.parent)),
         escape(v.record.sibling_label or "–"), escape("yes" if v.record.inherited else "")]
        for v in r.turns
    ]


def fork_sentence(r: SessionReport) -> str | None:
    if r.info.forked_from is None:
        return None
    sid, turn = r.info.forked_from
    return f"Forked from session {sid} at turn {turn}: the inherited turns are that session's, copied."
