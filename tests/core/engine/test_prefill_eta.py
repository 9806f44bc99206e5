"""The prefill ETA: a long prefill's later tokens cost more, and the ETA knows it."""

from __future__ import annotations

import pytest

from chatterm.core.engine.interface import PrefillProgress
from chatterm.core.metrics.format import prefill_progress_line

BATCH = 512


def simulated(total: int, done: int, base: float = 1e-3, growth: float = 2e-7) -> tuple[PrefillProgress, float]:
    """A prefill whose cost per token grows linearly with its position, as
    attention over a filling context does: the progress after `done` tokens,
    and the true seconds left."""
    def cost(a: int, b: int) -> float:  # seconds for positions a..b-1
        return base * (b - a) + growth * (b * b - a * a) / 2

    elapsed = cost(0, done)
    batch_s = cost(done - BATCH, done)
    return PrefillProgress(done, total, elapsed, BATCH, batch_s, 0), cost(done, total)


@pytest.mark.parametrize("done", [BATCH * 2, BATCH * 4, BATCH * 8])
def test_the_eta_follows_the_growing_cost_per_token(done):
    progress, truth = simulated(7485, done)
    naive = (progress.total - progress.done) / progress.rate
    assert naive < 0.8 * truth  # the rate so far promises far too much
    assert progress.eta_s == pytest.approx(truth, rel=0.1)


def test_without_batch_timing_the_eta_is_the_rate_so_far():
    p = PrefillProgress(100, 300, 2.0)
    assert p.eta_s == pytest.approx(4.0)
    assert PrefillProgress(0, 300, 0.0).eta_s is None


def test_the_eta_is_never_below_the_latest_batch_rate():
    # A latest batch faster than the mean (noise, another process finished):
    # no negative growth, and the latest rate is the floor.
    p = PrefillProgress(1024, 2048, 4.0, BATCH, 1.0, 0)
    assert p.eta_s == pytest.approx(1024 * 1.0 / BATCH)


def test_tokens_found_in_the_context_count_as_done_but_not_as_time_spent():
    # A persona prefix whose first 3 tokens were in the context: after its
    # first batch, the ETA is the computed tokens' rate, not a growth fitted
    # to 3 free tokens (it said 47 s with 11 s left).
    skipped = 3
    elapsed = 1.0  # the first batch, 512 tokens computed
    p = PrefillProgress(skipped + BATCH, 2368, elapsed, BATCH, elapsed, 0, skipped)
    assert p.rate == pytest.approx(BATCH / elapsed)
    assert p.eta_s == pytest.approx((2368 - skipped - BATCH) * elapsed / BATCH)


def test_the_progress_line_shows_the_rate_its_time_left_goes_on_from():
    """"3,072 / 5,763 tokens · 58 tok/s · 1m 52s left": 2,691 tokens at the
    mean rate shown are 46 s; the latest batch ran at 24 tok/s."""
    progress, _ = simulated(5763, BATCH * 6, base=1e-3, growth=1.2e-5)
    line = prefill_progress_line(progress)
    left = progress.total - progress.done
    assert progress.latest_rate < 0.6 * progress.rate
    assert f" · {progress.latest_rate:,.0f} tok/s · " in line
    assert progress.eta_s >= left / progress.latest_rate
