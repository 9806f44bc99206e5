"""The figures behind the Markdown and HTML reports, computed once per session.

Contract:
- `build(exported, prices)` turns stored sessions into `SessionReport`s: every
  turn's `Timeline` and `TokenCosts`, the running cost, the session summary,
  pooled per-token costs, the cost split and the what-if rows for every price
  profile in `prices` (empty: no what-if). Sessions keep their order; each gets
  a short key (`S1`, `S2`, ...) that the charts use to tell sessions apart.
- Only reads what the store returned; the renderers (`md_report`,
  `html_report`) only format what is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from chatterm.core.config.catalog import PriceProfile
from chatterm.core.metrics.timeline import Timeline, TokenCosts, session_token_costs, timeline, token_costs
from chatterm.core.metrics.turn_metrics import SessionSummary
from chatterm.core.metrics.whatif import CostSplit, WhatIf, cost_split, priced_with, what_if
from chatterm.core.store.session_store import SessionInfo, TurnRecord

Exported = Sequence[tuple[SessionInfo, Sequence[TurnRecord]]]


@dataclass(frozen=True)
class TurnView:
    record: TurnRecord
    timeline: Timeline
    costs: TokenCosts
    cumulative_usd: float
    """The session's cost up to and including this turn."""

    @property
    def index(self) -> int:
        return self.record.index


@dataclass(frozen=True)
class SessionReport:
    key: str
    info: SessionInfo
    turns: list[TurnView]
    summary: SessionSummary
    token_costs: TokenCosts
    split: CostSplit
    what_if: list[WhatIf]
    priced_with: list[str]
    """Profile ids the stored costs used (the what-if marks these)."""

    @property
    def label(self) -> str:
        """Untrusted (ids from files and the database): escape before output."""
        return f"{self.key}: session {self.info.id} · {self.info.model_id} · {self.info.persona_id}"


def build(exported: Exported, prices: Mapping[str, PriceProfile] | None = None) -> list[SessionReport]:
    reports = []
    for n, (info, records) in enumerate(exported, start=1):
        metrics = [r.metrics for r in records]
        views, running = [], 0.0
        for record in records:
            running += record.metrics.cost_usd
            views.append(TurnView(record, timeline(record.metrics), token_costs(record.metrics), running))
        reports.append(SessionReport(
            key=f"S{n}",
            info=info,
            turns=views,
            summary=SessionSummary.of(metrics),
            token_costs=session_token_costs(metrics),
            split=cost_split(metrics),
            what_if=what_if(metrics, prices or {}),
            priced_with=priced_with(metrics),
        ))
    return reports
