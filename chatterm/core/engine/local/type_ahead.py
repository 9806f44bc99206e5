"""Type-ahead bookkeeping of the local engine: prefilling a message while it is typed.

Contract:
- A `TypeAhead` is one engine's type-ahead state: the current prefill's epoch
  (`drop()` starts a new one; a prefill of an older epoch stops), whether a
  prefill is running, and what was prefilled ahead since the last turn. It
  reads whether a turn waits for the context from the event it is given (the
  engine's `ContextGate.turn_waiting`).
- `prefill()` brings the context from the tokens it holds to the draft's
  tokens: it trims to their common prefix and prefills the rest in
  AHEAD_BATCH-token batches, stopping between batches for a waiting turn or a
  newer epoch. The caller holds the engine's lock and renders the draft's
  prompt; it also owns llama.cpp's abort flag, which it raises when `drop()`
  or a waiting turn finds a prefill running (that stops a batch mid-way).
- `take()` credits a turn with the tokens it reused that were prefilled ahead
  (and their time) as an `AheadCredit`, then forgets them; so does `forget()`
  when the context is cleared.
- `began` says whether anything was prefilled ahead since the last turn: the
  engine looks in the prompt cache at the first prefill after a turn (a
  resumed conversation's state is restored then, not prefilled again), and
  keeps that restore in `restored` for the turn to report; `take()` and
  `forget()` drop it too.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from chatterm.core.cache.tokens import common_prefix_len
from chatterm.core.engine.interface import AheadReport
from chatterm.core.engine.local import kv_state

if TYPE_CHECKING:  # types only: llama_cpp is loaded by the engine
    import llama_cpp

    from chatterm.core.engine.local.outcome import Reuse

AHEAD_BATCH = 32
"""Tokens per type-ahead decode: a turn that starts waits for at most one batch
(less: it also sets the abort flag, which stops the batch at its next node)."""


@dataclass(frozen=True)
class AheadCredit:
    """The context positions [start, end) a turn reused that were prefilled ahead."""

    start: int
    end: int
    ms: float

    @property
    def tokens(self) -> int:
        return self.end - self.start

    def before(self, position: int) -> int:
        """Of the credited tokens, those before `position` (the history's end)."""
        return max(min(position, self.end) - self.start, 0)


class _Stop:
    """`threading.Event`-like, for kv_state.prefill: set for a waiting turn or a newer epoch."""

    def __init__(self, ahead: "TypeAhead", epoch: int):
        self._ahead = ahead
        self._epoch = epoch

    def is_set(self) -> bool:
        return self._ahead.stopped(self._epoch)


class TypeAhead:
    def __init__(self, turn_waiting: threading.Event) -> None:
        self.turn_waiting = turn_waiting
        """Set while a turn waits for the engine's lock: a prefill yields to it."""
        self.epoch = 0
        """Bumped by drop(): a prefill of an older epoch stops."""
        self.running = False
        """A prefill holds the context (set by the engine around `prefill`)."""
        self._from: int | None = None
        """Context position where prefilling ahead began since the last turn."""
        self._ms = 0.0
        self.restored: Reuse | None = None
        """The state restored from the prompt cache before prefilling ahead
        (a resumed conversation), for the next turn to report as its restore."""
        self.shifted = 0
        self.shift_ms = 0.0
        """Tokens shifted out of the live context while prefilling ahead (under
        `context_overflow = "shift"`), and the time: the next turn's, which
        finds the shift done, while the context still holds what followed the
        first `shift_keep` tokens (the persona) when it was made."""
        self.shift_keep = 0

    @property
    def began(self) -> bool:
        """Something was prefilled ahead since the last turn (or context clear)."""
        return self._from is not None

    def stopped(self, epoch: int) -> bool:
        """A prefill of `epoch` must stop (a turn waits, or it was dropped)."""
        return self.turn_waiting.is_set() or self.epoch != epoch

    def drop(self) -> bool:
        """Stop the prefill in progress; True when one is running (its batch needs aborting)."""
        self.epoch += 1
        return self.running

    def prefill(
        self,
        llm: llama_cpp.Llama,
        live: list[int],
        target: list[int],
        total: int,
        progress: Callable[[int, int], None] | None,
        epoch: int,
        decoded: Callable[[], None] | None = None,
        first: int | None = None,
    ) -> AheadReport | None:
        """Make the context (`live`) hold `target`; None when llama.cpp could not
        trim it. `decoded()` after each batch's decode, `first` the first batch's
        size (`kv_state.prefill`)."""
        common = common_prefix_len(live, target)
        if not kv_state.trim(llm, common):
            return None  # the context was cleared
        if self.shifted and common <= self.shift_keep:
            # Trimmed back to the persona (another conversation, a branch):
            # what the shift kept is gone, and the shift is no turn's.
            self.shifted, self.shift_ms = 0, 0.0
        self._from = common if self._from is None else min(self._from, common)
        if self.restored is not None and common < self.restored.tokens:
            self.restored = None  # trimmed into the state it restored: the turn did not start from it
        t0 = time.perf_counter()
        try:
            kv_state.prefill(
                llm,
                target[common:],
                (lambda p: progress(common + p.done, total)) if progress is not None else None,
                _Stop(self, epoch),
                AHEAD_BATCH,
                decoded,
                first,
            )
        finally:
            # Interrupted or not, the batches done are ready and their time was spent.
            ms = (time.perf_counter() - t0) * 1000.0
            self._ms += ms
        return AheadReport(llm.n_tokens, total, ms)

    def take(self, reused: int) -> AheadCredit | None:
        """The `reused` live-context tokens that were prefilled ahead, or None;
        what was prefilled ahead is forgotten either way."""
        start, ms = self._from, self._ms
        self.forget()
        if start is None or reused <= start:
            return None
        return AheadCredit(start, reused, ms)

    def note_shift(self, tokens: int, ms: float, keep: int) -> None:
        if tokens:
            self.shifted += tokens
            self.shift_ms += ms
            self.shift_keep = keep

    def forget(self) -> None:
        self._from = None
        self._ms = 0.0
        self.restored = None
        self.shifted, self.shift_ms, self.shift_keep = 0, 0.0, 0
