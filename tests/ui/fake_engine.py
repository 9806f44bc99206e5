"""A scripted Engine for UI layout tests (the real model is used everywhere else).

It implements the `chatterm.core.engine.interface` contract with canned replies: each
token goes through `Turn.token_arrived`, so TTFT, decode rate and cost are
computed by the core exactly as for a real engine. `gate` lets a test hold
the stream after a given number of tokens (to press Esc mid-reply).
"""

from __future__ import annotations

import threading
import time
from typing import Iterator, Sequence

from chatterm.core.config.personas import Persona
from chatterm.core.engine.interface import ChatMessage, DeviceInfo, Engine, PrefixReport, Turn
from chatterm.core.metrics.turn_metrics import CacheOutcome, StopReason, TurnMetrics
from chatterm.errors import ChattermError


def tokens_of(text: str) -> list[str]:
    """Split like a tokenizer would, roughly: words with their leading space."""
    out: list[str] = []
    word = ""
    for ch in text:
        if ch in " \n" and word:
            out.append(word)
            word = ""
        word += ch
    if word:
        out.append(word)
    return out


class FakeEngine(Engine):
    kind = "fake"

    def __init__(self, spec, price, replies: Sequence[str] = (), *, delay_s: float = 0.0,
                 fail_load: str | None = None, prepare_gate: threading.Event | None = None):
        super().__init__(spec, price)
        self.replies = list(replies)
        self.delay_s = delay_s
        self.fail_load = fail_load
        self.fail_turn: str | None = None
        self.turn_notices: list[str] = []
        self.dropped_turns = 0
        """Oldest history turns each turn reports its prompt left out."""
        self.cache_outcome = CacheOutcome.RESTORED
        self.hold_after: int | None = None
        self.gate = threading.Event()
        self.held = threading.Event()
        self.prepared: list[str] = []
        self.cached: dict[str, str] = {"assistant": "disk"}
        """Persona id -> cache tier, as cached_personas() reports it."""
        self.cache_scans = 0
        self.cache_scan_threads: list[threading.Thread] = []
        self.received: list[tuple[str, list[ChatMessage], str]] = []
        self.loaded = False
        self.closed = False
        self.load_gate: threading.Event | None = None
        self.loading = threading.Event()
        self.prepare_gate = prepare_gate
        """When given, prepare_persona holds the engine until the gate opens."""

    def load(self, progress=None) -> None:
        self.loading.set()
        if self.load_gate is not None:
            self.load_gate.wait(timeout=30)
        for step in range(5):
            if progress:
                progress(step / 4)
        if self.fail_load:
            raise ChattermError(self.fail_load)
        self.loaded = True

    def device(self) -> DeviceInfo:
        return DeviceInfo("CPU", "Fake CPU 9000", n_layers=30, layers_offloaded=0, kv_type="f16",
                          flash_attn=False, n_ctx=8192)

    def context_used(self) -> int:
        return 123

    def cached_personas(self) -> dict[str, str]:
        self.cache_scans += 1
        self.cache_scan_threads.append(threading.current_thread())
        return dict(self.cached)

    def prepare_persona(self, persona: Persona, progress=None) -> PrefixReport:
        with self._lock:
            self.prepared.append(persona.id)
            if self.prepare_gate is not None:
                self.prepare_gate.wait(timeout=30)
            return PrefixReport(CacheOutcome.RESTORED, 12.5, 60, tier="disk")

    def start_turn(self, persona: Persona, history: Sequence[ChatMessage], user_text: str) -> Turn:
        self.received.append((persona.id, list(history), user_text))
        reply = self.replies.pop(0) if self.replies else f"Echo: {user_text[:40]}"
        metrics = TurnMetrics(engine=self.kind, model_id=self.spec.id, persona_id=persona.id,
                              submitted_at=time.time(), dropped_turns=self.dropped_turns)
        turn = Turn(metrics, self.price, lambda t: self._generate(t, user_text, tokens_of(reply)))
        turn.notices.extend(self.turn_notices)
        return turn

    def _generate(self, turn: Turn, user_text: str, tokens: list[str]) -> Iterator[str]:
        with self._lock:
            turn.engine_started()
            m = turn.metrics
            m.prompt_tokens = 40 + len(user_text) // 4
            m.cached_tokens = 30
            m.prefilled_tokens = m.prompt_tokens - m.cached_tokens
            m.cache_outcome = self.cache_outcome
            m.restore_ms = 12.5 if self.cache_outcome == CacheOutcome.RESTORED else None
            m.seed = 1000 + len(self.received)  # as a sampled reply records it
            if self.fail_turn:
                raise ChattermError(self.fail_turn)
            for index, token in enumerate(tokens):
                if self.hold_after is not None and index == self.hold_after:
                    self.held.set()
                    self.gate.wait(timeout=30)
                if turn.cancelled:
                    m.stop_reason = StopReason.CANCELLED
                    return
                turn.token_arrived()
                yield token
                if self.delay_s:
                    time.sleep(self.delay_s)
            m.stop_reason = StopReason.EOS

    def close(self) -> None:
        self.closed = True
