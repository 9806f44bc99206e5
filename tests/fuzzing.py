"""Hypothesis settings for the fuzz tests (tests/fuzz/).

Two profiles, chosen by the CHATTERM_FUZZ environment variable:
- "ci" (default): a bounded, derandomized run (the same examples every time, no
  example database), so the whole fuzz set stays under a minute on 2 cores;
- "long": LONG_FACTOR times the examples, random and remembered in
  .hypothesis/ (scripts/fuzz_long.sh runs it and prints the case counts).

Each test asks for `fuzz(ci_examples, deadline_s)`: its CI budget, and a
per-case deadline that turns a hang into a failure.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("CHATTERM_FUZZ", "ci")
LONG_FACTOR = int(os.environ.get("CHATTERM_FUZZ_FACTOR", "40"))

if PROFILE not in ("ci", "long"):
    raise RuntimeError(f"CHATTERM_FUZZ={PROFILE!r}: use 'ci' or 'long'")

_COMMON = dict(
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
settings.register_profile("long", **_COMMON)
settings.load_profile(PROFILE)


def fuzz(ci_examples: int, deadline_s: float = 5.0) -> settings:
    """Settings for one fuzz test: `ci_examples` cases in CI, LONG_FACTOR times more
    in the long run; a case slower than `deadline_s` fails (a hang is a bug)."""
    factor = LONG_FACTOR if PROFILE == "long" else 1
    return settings(max_examples=ci_examples * factor, deadline=timedelta(seconds=deadline_s))
