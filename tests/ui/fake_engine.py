"""A scripted Engine for UI layout tests (the real model is used everywhere else).

It implements the `chatterm.core.engine` contract with canned replies: each
token goes through `Turn._token_arrived`, so TTFT, decode rate and cost are
computed by the core exactly as for a real engine. `gate` lets a test hold
the stream after a given number of tokens (to press Esc mid-reply).
"""

from __future__ import annotations

import threading
import time
from typing import Iterator, Sequence

from chatterm.core.engine import ChatMessage, DeviceInfo, Engine, PrefixReport, Turn
from chatterm.core.errors import ChattermError
from chatterm.core.metrics import TurnMetrics
from chatterm.core.personas import Persona


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


class FakeTurn(Turn):
    def __init__(self, engine: "FakeEngine", persona: Persona, user_text: str, metrics: TurnMetrics,
                 reply: str):
        super().__init__(metrics, engine.price)
        self.engine = engine
        self.user_text = user_text
        self.tokens = tokens_of(reply)
        self.notices.extend(engine.turn_notices)

    def _produce(self) -> Iterator[str]:
        engine = self.engine
        with engine._lock:
            m = self.metrics
            m.prompt_tokens = 40 + len(self.user_text) // 4
            m.cached_tokens = 30
            m.prefilled_tokens = m.prompt_tokens - m.cached_tokens
            m.cache_outcome = engine.cache_outcome
            m.restore_ms = 12.5 if engine.cache_outcome == "restored" else None
            if engine.fail_turn:
                raise ChattermError(engine.fail_turn)
            for index, token in enumerate(self.tokens):
                if engine.hold_after is not None and index == engine.hold_after:
                    engine.held.set()
                    engine.gate.wait(timeout=30)
                if self.cancelled:
                    m.stop_reason = "cancelled"
                    return
                self._token_arrived()
                yield token
                if engine.delay_s:
                    time.sleep(engine.delay_s)
            m.stop_reason = "eos"


class FakeEngine(Engine):
    kind = "fake"

    def __init__(self, spec, price, replies: Sequence[str] = (), *, delay_s: float = 0.0,
                 fail_load: str | None = None):
        super().__init__(spec, price)
        self.replies = list(replies)
        self.delay_s = delay_s
        self.fail_load = fail_load
        self.fail_turn: str | None = None
        self.turn_notices: list[str] = []
        self.cache_outcome = "restored"
        self.hold_after: int | None = None
        self.gate = threading.Event()
        self.held = threading.Event()
        self.prepared: list[str] = []
        self.cached: set[str] = {"assistant"}
        self.received: list[tuple[str, list[ChatMessage], str]] = []
        self.loaded = False
        self.closed = False
        self.load_gate: threading.Event | None = None
        self.loading = threading.Event()

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

    def persona_cached(self, persona: Persona) -> bool:
        return persona.id in self.cached

    def prepare_persona(self, persona: Persona) -> PrefixReport:
        with self._lock:
            self.prepared.append(persona.id)
            return PrefixReport("restored", 12.5, 60)

    def start_turn(self, persona: Persona, history: Sequence[ChatMessage], user_text: str) -> FakeTurn:
        self.received.append((persona.id, list(history), user_text))
        reply = self.replies.pop(0) if self.replies else f"Echo: {user_text[:40]}"
        metrics = TurnMetrics(engine=self.kind, model_id=self.spec.id, persona_id=persona.id,
                              submitted_at=time.time())
        return FakeTurn(self, persona, user_text, metrics, reply)

    def close(self) -> None:
        self.closed = True
