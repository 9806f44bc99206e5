"""Who holds a local engine's llama.cpp context, and how the others make it let go.

Contract:
- `lock` admits one holder at a time (a turn, a persona prepare, a type-ahead
  batch, a state capture, a reset): a llama.cpp context has no locking of its
  own. It is the engine's lock (`Engine` makes one per engine).
- `abort` is llama.cpp's abort flag: raised, it stops the decode in progress
  at its next graph node (`RuntimeError` from the decode). Whoever takes the
  lock lowers it before decoding.
- `turn_waiting` is set while a turn waits for the lock: a type-ahead prefill
  gives way to it between batches (`chatterm.core.engine.local.type_ahead`).
- `running` is the turn holding the lock, so a cancel aborts that turn's
  decode and no other holder's; `preparing` is the persona a persona prepare
  is working on, named to a turn that stops waiting for it.
- `acquire_for(turn)` takes the lock for a turn, or gives up within
  LOCK_POLL_S of the turn's cancel. The holder goes on: a persona prefill is
  the persona's work (the next turn reuses it), and a type-ahead batch was
  told to give way already.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from chatterm.core.engine.interface import Turn

if TYPE_CHECKING:  # a type only: the model module loads llama_cpp
    from chatterm.core.engine.local.model import AbortFlag

LOCK_POLL_S = 0.05
"""How often a turn waiting for the lock looks for its cancel: a persona
prefill may hold the lock for many seconds."""


class ContextGate:
    def __init__(self, lock: threading.Lock, abort: AbortFlag):
        self.lock = lock
        self.abort = abort
        self.turn_waiting = threading.Event()
        self.running: Turn | None = None
        """The turn holding the lock, while it runs."""
        self.preparing: str | None = None
        """The id of the persona being prepared while its prepare holds the lock."""

    def acquire_for(self, turn: Turn) -> bool:
        """Take the lock for `turn`; False when the turn is cancelled first."""
        while not self.lock.acquire(timeout=LOCK_POLL_S):
            if turn.cancelled:
                return False
        return True

    def abort_if_running(self, turn: Turn) -> None:
        """Stop `turn`'s decode, when `turn` is the holder (from a cancel)."""
        if self.running is turn:
            self.abort.set(True)
