"""The engine interface shared by the local (llama.cpp) and remote (OpenAI) engines.

Contract:
- `Engine.load(progress)` loads once (progress gets 0.0..1.0) and raises
  `ChattermError` with one line on failure. Everything else may be called
  only after a successful load.
- `Engine.start_turn(persona, history, user_text)` returns a `Turn` at once; the
  caller drives `Turn.stream()` from one worker thread. The generation is the
  engine's own code; a `Turn` is only the handle: `stream()` yields text deltas
  and never raises (a failure ends the stream with `metrics.stop_reason ==
  StopReason.ERROR` and `metrics.error` set), `cancel()` is safe from any thread
  and stops the stream within one token (the partial reply stays in
  `Turn.reply`), `metrics` fills while it streams.
- An engine runs one turn at a time (a lock guards it: llama.cpp contexts have
  no locking of their own).
- Callers never ask which engine they hold: what differs is declared in
  `Engine.capabilities`. The UI, the store and the export know nothing of the
  engine beyond `TurnMetrics.engine` and `model_id`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from abc import ABC, abstractmethod
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from chatterm.core.config.catalog import ModelSpec, PriceProfile
from chatterm.core.config.personas import Persona
from chatterm.core.metrics.cost import apply_cost
from chatterm.core.metrics.format import counted
from chatterm.core.metrics.turn_metrics import CacheOutcome, StopReason, TurnMetrics
from chatterm.errors import ChattermError, describe

log = logging.getLogger(__name__)

Progress = Callable[[float], "bool | None"]
"""Load progress 0.0..1.0; returning False asks the engine to abandon the load."""


@dataclass(frozen=True)
class ReplyTokens:
    """The token ids a local model sampled for a reply, in order (the end of
    generation token left out): the next prompt carries them instead of the
    reply's text tokenized again, which splits differently (" Colosse" + "a"
    sampled, " Colos" + "sea" re-tokenized) and would part from the cached KV
    there. Only the model they were sampled by reads them."""

    model_identity: str
    data: bytes
    """The ids as little-endian int32s: 4 bytes a token, in memory as in SQLite
    (a long session's history read whole costs no more than its blob)."""

    @classmethod
    def of(cls, model_identity: str, ids: Sequence[int]) -> "ReplyTokens":
        packed = array("i", ids)
        if sys.byteorder == "big":
            packed.byteswap()
        return cls(model_identity, packed.tobytes())

    @property
    def ids(self) -> list[int]:
        packed = array("i")
        packed.frombytes(self.data)
        if sys.byteorder == "big":
            packed.byteswap()
        return packed.tolist()


@dataclass(frozen=True)
class ChatMessage:
    role: str
    """"user" or "assistant" (the persona supplies the system message)."""
    content: str
    tokens: ReplyTokens | None = field(default=None, compare=False)
    """An assistant reply's sampled tokens, when a local model wrote it."""


MIN_REPLY_TOKENS = 64
"""Room always left for the reply when history is trimmed to fit the context."""

def reply_room(max_tokens: int, n_ctx: int) -> int:
    """Tokens kept free for the reply: the persona's max_tokens, capped at a quarter
    of the context (at least MIN_REPLY_TOKENS), so a large max_tokens does not
    trim away a whole history for a reply that stays short."""
    return min(max_tokens, max(MIN_REPLY_TOKENS, n_ctx // 4))


def context_full_notice(n_ctx: int, dropped: int, how: str = "") -> str:
    return f"Context full ({n_ctx} tokens{how}): dropped the oldest {counted(dropped, 'turn')} from the prompt."


@dataclass
class DeviceInfo:
    """What the dashboard's model line shows."""

    backend: str
    """"CPU", "CUDA", ... or "remote"."""
    name: str
    """CPU model, GPU name, or the server URL."""
    n_layers: int | None = None
    layers_offloaded: int | None = None
    kv_type: str = ""
    flash_attn: bool | None = None
    n_ctx: int = 0
    notes: list[str] = field(default_factory=list)
    """Things the user should know, e.g. "fell back to CPU: out of GPU memory"."""
    overflow: str = ""
    threads: str = ""
    """CPU threads in use: "2 decode · 2 prefill of 2 cores"; "" where not known."""
    """What a conversation longer than the context does, and why: "shift (the
    model's memory can shift)"; "" for engines that do not say."""


@dataclass(frozen=True)
class PrefixReport:
    """How a persona's prefix was made ready (switch time or first turn)."""

    outcome: CacheOutcome
    """RESTORED, MEMORY, COLD or SERVER."""
    ms: float
    tokens: int
    detail: str = ""
    tier: str = ""
    """For RESTORED: the prompt cache tier it came from, "ram" or "disk"."""


@dataclass(frozen=True)
class PrefillProgress:
    """How far a long prefill has got (a turn's, or a persona's being prepared)."""

    done: int
    total: int
    elapsed_s: float
    batch: int = 0
    """Tokens of the latest batch (0: not known)."""
    batch_s: float = 0.0
    """Seconds the latest batch took."""
    offset: int = 0
    """Tokens the context held before this prefill's first."""
    skipped: int = 0
    """Of `done`, the first tokens, found in the context rather than computed
    (a persona prefix's template opening): they took none of `elapsed_s`."""

    @property
    def rate(self) -> float:
        """Tokens computed per second so far (0 before the first batch)."""
        return (self.done - self.skipped) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def latest_rate(self) -> float:
        """Tokens per second of the latest batch, the speed the ETA goes on
        from (the rate so far before one is known)."""
        return self.batch / self.batch_s if self.batch > 0 and self.batch_s > 0 else self.rate

    @property
    def eta_s(self) -> float | None:
        """Seconds left (None before the first batch).

        A token's cost grows with its position in the context (attention reads
        every earlier one), so the rate so far overstates the speed of what is
        left: a 71 s prefill said "29s left" at 5 s. With the latest batch's
        cost known, the cost per token is taken as growing linearly with the
        position (fitted to the mean so far and the latest batch), and never
        below the latest batch's."""
        rate = self.rate
        if rate <= 0:
            return None
        left, computed = self.total - self.done, self.done - self.skipped
        if not (0 < self.batch < computed and self.batch_s > 0):
            return left / rate
        latest = self.batch_s / self.batch
        mean = self.elapsed_s / computed
        at_latest = self.offset + self.done - self.batch / 2
        at_mean = self.offset + self.skipped + computed / 2
        growth = max((latest - mean) / (at_latest - at_mean), 0.0)
        start, end = self.offset + self.done, self.offset + self.total
        return max(latest * left + growth * ((end * end - start * start) / 2 - at_latest * left), latest * left)



@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do, so callers never ask which engine they hold."""

    persona_cache: bool = False
    """Persona prefixes are prepared and cached by this process: `prepare_persona`
    does real work (seconds on a first use) and `cached_personas` is meaningful."""
    kv_control: bool = False
    """The KV state is local and controllable: `reset_context()`, turns with
    `use_cache=False`, and `exclusive()` (benchmarks measure cold / restored /
    in-memory turns and the bare library against each other)."""
    prefill_ahead: bool = False
    """`prefill_ahead()` prefills a message while it is still being typed."""


@dataclass(frozen=True)
class AheadReport:
    """What a type-ahead prefill left ready in the context."""

    ready: int
    """Tokens of the draft's prompt now in the context (persona and history included)."""
    total: int
    """Tokens of the prompt a send of the draft would have."""
    ms: float
    """Time this call spent prefilling."""


Produce = Callable[["Turn"], Iterator[str]]
"""An engine's generation for one turn: yields text deltas, calls
`turn.token_arrived()` once per token, sets `turn.metrics.stop_reason`, checks
`turn.cancelled` on every token and may raise (the Turn reports it)."""


class Turn:
    """One streamed assistant reply: a handle over the engine's own generation.

    The engine builds it with its `Produce` function; callers only stream,
    cancel and read. See the module contract."""

    def __init__(self, metrics: TurnMetrics, price: PriceProfile | None, produce: Produce):
        self.metrics = metrics
        self.reply = ""
        self.notices: list[str] = []
        """One-line messages for the user (e.g. "dropped 2 oldest turns")."""
        self.perf: dict[str, float] = {}
        """The engine's own counters for this turn, where it has them (llama.cpp's
        `llama_perf_context`: t_p_eval_ms, n_p_eval, t_eval_ms, n_eval)."""
        self.prefill_progress: PrefillProgress | None = None
        """While a long prompt is prefilled: tokens done / total, rate and time
        left; None when the engine does not say."""
        self.request: dict[str, Any] = {}
        """What a served engine sent (the request body after trimming); never a secret."""
        self._sampled: tuple[str, list[int]] | None = None
        self._price = price
        self._produce = produce
        self._cancel = threading.Event()
        self._cancel_hooks: list[Callable[[], None]] = []
        self._t_submit = time.perf_counter()
        self._t_first: float | None = None
        self._finished: list[Callable[[Turn], None]] = []
        self.done = False
        self.abandoned = False
        """Cancelled by `abandon()`: the caller gives the turn up."""

    # -- for callers -----------------------------------------------------
    def cancel(self) -> None:
        self._cancel.set()
        for hook in list(self._cancel_hooks):
            hook()

    def abandon(self) -> None:
        """Cancel, giving the turn up (Ctrl+C in `chatterm ask`): a first turn
        abandoned before any text makes no session (`Conversation`). A cancel
        (Esc, a switch) keeps the message: the TUI still shows it."""
        self.abandoned = True
        self.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def reply_tokens(self) -> ReplyTokens | None:
        """The reply's sampled tokens so far (None: the engine does not keep them)."""
        if self._sampled is None:
            return None
        return ReplyTokens.of(*self._sampled)

    def on_finished(self, callback: Callable[["Turn"], None]) -> None:
        """Run `callback(turn)` in the streaming thread once the turn has ended."""
        self._finished.append(callback)

    def stream(self) -> Iterator[str]:
        try:
            for delta in self._produce(self):
                if delta:
                    self.reply += delta
                    yield delta
        except ChattermError as exc:
            self._fail(str(exc))
        except (GeneratorExit, KeyboardInterrupt):
            # The consumer stopped iterating (or Ctrl+C): that is a cancel.
            self._cancel.set()
            raise
        except Exception as exc:  # noqa: BLE001 - a turn must never crash its caller
            # The error reaches the user through metrics.error; the traceback
            # only with debug logging (chatterm -v), never in their face.
            log.debug("turn failed", exc_info=True)
            self._fail(describe(exc))
        finally:
            self._finish()

    # -- for engines -----------------------------------------------------
    def on_cancel(self, hook: Callable[[], None]) -> None:
        """Run `hook()` (from the cancelling thread) when the turn is cancelled:
        an engine wakes whatever its generation is blocked on."""
        self._cancel_hooks.append(hook)

    def engine_started(self) -> None:
        """Call once the engine has the model for this turn: the time since submit
        (waiting for a persona prepare, a type-ahead batch) is `metrics.wait_ms`."""
        self.metrics.wait_ms = (time.perf_counter() - self._t_submit) * 1000.0

    def stopped_waiting(self, detail: str) -> None:
        """Call when the turn was cancelled before the engine started it: the
        wait is `metrics.wait_ms`, and nothing was reused or prefilled
        (`CacheOutcome.NONE`, with `detail` saying what it waited for)."""
        m = self.metrics
        m.wait_ms = (time.perf_counter() - self._t_submit) * 1000.0
        m.cache_outcome = CacheOutcome.NONE
        m.cache_detail = detail
        m.stop_reason = StopReason.CANCELLED

    def keep_tokens(self, model_identity: str, ids: list[int]) -> None:
        """Call before sampling: `ids` is the list the engine appends each reply
        token to as it yields its text (so a reply stopped mid-stream has them too)."""
        self._sampled = (model_identity, ids)

    def token_arrived(self) -> None:
        now = time.perf_counter()
        m = self.metrics
        if self._t_first is None:
            self._t_first = now
            m.ttft_ms = (now - self._t_submit) * 1000.0
        else:
            m.decode_ms = (now - self._t_first) * 1000.0
        m.generated_tokens += 1

    def _fail(self, message: str) -> None:
        self.metrics.stop_reason = StopReason.ERROR
        self.metrics.error = message

    def _finish(self) -> None:
        if self.done:
            return
        m = self.metrics
        if not m.stop_reason:
            m.stop_reason = StopReason.CANCELLED if self.cancelled else StopReason.EOS
        m.total_ms = (time.perf_counter() - self._t_submit) * 1000.0
        if self._price is not None:
            apply_cost(m, self._price)
        self.done = True
        for callback in self._finished:
            try:
                callback(self)
            except Exception as exc:  # noqa: BLE001 - recording must not break the stream
                log.warning("turn finish callback failed: %s", exc)
                log.debug("turn finish callback failed", exc_info=True)


class Engine(ABC):
    kind: str = ""
    """Recorded with each turn ("local", "openai"); never used to decide behaviour
    (that is what `capabilities` is for)."""
    capabilities = EngineCapabilities()

    def __init__(self, spec: ModelSpec, price: PriceProfile):
        self.spec = spec
        self.price = price
        self._lock = threading.Lock()

    @abstractmethod
    def load(self, progress: Progress | None = None) -> None: ...

    @abstractmethod
    def device(self) -> DeviceInfo: ...

    @property
    def model_identity(self) -> str:
        """A string identifying the exact model (file sha256, or server + model)."""
        return self.spec.id

    def context_used(self) -> int:
        """Tokens currently held in the context (0 when unknown)."""
        return 0

    def persona_tokens(self, persona: Persona) -> int | None:
        """Tokens `persona`'s prompt takes in the context before any message,
        once this engine has measured it (it prepared the persona); None when
        unknown. Never computes: cheap from any thread."""
        return None

    def persona_misfit(self, persona: Persona) -> str | None:
        """Why `persona` cannot chat on this model, in a few words ("2,368 tokens:
        more than the 1,024-token context holds"), else None (also where the
        engine cannot tell before it tries: a server). Tokenizes its prompt:
        from a worker thread."""
        return None

    def cached_personas(self) -> dict[str, str]:
        """Personas whose prefix state is cached, from one look at the cache:
        persona id -> where a restore would read it, "ram" (first) or "disk".
        Empty for an engine without a persona cache (a server keeps its own)."""
        return {}

    def cache_notice(self) -> str | None:
        """A one-time notice about the persona cache (e.g. it cannot be written)."""
        return None

    def prepare_persona(
        self, persona: Persona, progress: Callable[[PrefillProgress], None] | None = None
    ) -> PrefixReport:
        """Make the persona's prefix ready now (e.g. on a persona switch); a long
        prefill reports `progress` after each batch."""
        return PrefixReport(CacheOutcome.SERVER, 0.0, 0)

    def note_conversation(self, session_id: int | None) -> None:  # noqa: B027 - optional: a no-op where the engine has nothing to do
        """The next turn continues stored session `session_id` (None: a new one),
        so an engine with a conversation cache can name that session's misses."""

    def keep_conversation(self, session_id: int) -> None:  # noqa: B027 - optional: a no-op where the engine has nothing to do
        """A turn of session `session_id` was recorded: an engine with a
        conversation cache keeps the context's state for it (no-op here)."""

    @abstractmethod
    def start_turn(
        self, persona: Persona, history: Sequence[ChatMessage], user_text: str
    ) -> Turn: ...

    def prefill_ahead(
        self,
        persona: Persona,
        history: Sequence[ChatMessage],
        draft: str,
        progress: Callable[[int, int], None] | None = None,
        session_id: int | None = None,
    ) -> AheadReport | None:
        """Prefill, in the calling thread, the prompt a send of `draft` would
        start with; None when the engine cannot (a served model) or is busy.
        It yields to a starting turn and to `drop_ahead()` between batches;
        `progress(ready, total)` is called after each batch. `session_id`: the
        stored conversation `history` is of; an empty draft's prefill that
        fills its whole history may be kept as its cached state, while it is
        still the conversation `note_conversation` named."""
        return None

    def drop_ahead(self) -> None:  # noqa: B027 - optional: a no-op where the engine has nothing to do
        """Stop a type-ahead prefill and forget it (persona switch, new
        conversation, the draft was cleared); callable from any thread."""

    def interrupt(self) -> None:  # noqa: B027 - optional: a no-op where the engine has nothing to do
        """Stop whatever the engine is computing as soon as it can (app exit);
        callable from any thread. A running turn ends as cancelled."""

    def close(self) -> None:  # noqa: B027 - optional: a no-op where the engine has nothing to do
        """Release the model / connections. Safe to call twice."""
