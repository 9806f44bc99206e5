"""When the app collects garbage: at idle moments, never mid-reply.

A full (generation 2) collection scans every live object: with a long
conversation on screen that paused the event loop for 40-60 ms. So the app
collects at moments when nothing animates (after start-up, after a
conversation is replaced, a little after a reply ends) and then freezes the
survivors (`gc.freeze`): later collections, automatic ones during streaming
included, skip frozen objects and only pay for what was allocated since.
"""

from __future__ import annotations

import gc


def collect_when_idle() -> None:
    """Collect what is unreachable, then freeze what survives.

    Unfreezing first lets widgets removed since the last freeze (a new
    conversation, a resume) be collected here instead of leaking.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
