"""The local engine's context gate: a turn waiting for the context gives up on
its cancel, and a cancel aborts only the decode of the turn that runs."""

from __future__ import annotations

import threading
import time

from chatterm.core.engine.interface import Turn
from chatterm.core.engine.local.context_gate import ContextGate
from chatterm.core.engine.local.model import AbortFlag
from chatterm.core.metrics.turn_metrics import TurnMetrics


def turn() -> Turn:
    return Turn(TurnMetrics("local", "m", "p", time.time()), None, lambda t: iter(()))


def gate() -> ContextGate:
    return ContextGate(threading.Lock(), AbortFlag())


def test_a_free_context_is_taken():
    g = gate()
    assert g.acquire_for(turn())
    assert g.lock.locked()


def test_a_turn_cancelled_while_it_waits_gives_up_and_the_holder_keeps_the_lock():
    g, waiting = gate(), turn()
    g.lock.acquire()  # a persona prepare holds the context
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(g.acquire_for(waiting)))
    waiter.start()
    waiting.cancel()
    waiter.join(timeout=30)
    assert result == [False]
    assert g.lock.locked()  # still the holder's
    g.lock.release()


def test_a_cancel_aborts_the_running_turn_only():
    g, running, other = gate(), turn(), turn()
    g.running = running
    g.abort_if_running(other)
    assert not g.abort.is_set
    g.abort_if_running(running)
    assert g.abort.is_set
