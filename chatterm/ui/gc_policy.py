"""When the app collects garbage: never a full pass while a reply streams.

A full (generation 2) collection scans every live object: with a long
conversation on screen that paused the event loop for 40-60 ms, and up to
300 ms once a few hundred earlier messages were mounted. So:

- `allow_full_passes(False)` turns off automatic full collections from the
  start of a reply until the next idle collection; the young generations are still collected as usual (their cost is
  bounded by what was allocated since the last one).
- `collect_recent()`, at an idle moment (two seconds after a reply ends, after
  start-up, after older messages were paged in), collects what is not frozen,
  i.e. what was allocated since the last call, and freezes the survivors
  (`gc.freeze`): later collections skip them.
- `collect_all()` unfreezes first so that frozen objects that became garbage
  (the widgets of a replaced conversation) are reclaimed; it is the one pass
  that costs what the heap holds, so it runs only when the whole conversation
  is replaced.
"""

from __future__ import annotations

import gc

_OLD_THRESHOLD = gc.get_threshold()[2]
NO_AUTOMATIC_FULL_PASS = 2**31 - 1


def allow_full_passes(allowed: bool) -> None:
    """Let the collector start full passes by itself (True, Python's default) or not."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, _OLD_THRESHOLD if allowed else NO_AUTOMATIC_FULL_PASS)


def collect_recent() -> None:
    """Collect the objects allocated since the last freeze, then freeze what survives."""
    gc.collect()
    gc.freeze()


def collect_all() -> None:
    """Collect everything, frozen objects included, then freeze what survives."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
