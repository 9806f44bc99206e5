"""The local engine: llama.cpp in process, with a token-keyed prompt cache.

Contract (beyond chatterm.core.engine.interface):
- `load()` opens the model once (`chatterm.core.engine.local.model`: progress, log
  routing, GPU offload with fallback; the file's load begun when the engine was
  made, `early`, is taken or freed), hashes the model file (cached), resolves
  the chat template (`chatterm.core.engine.local.templates`: the models.toml `chat_template`
  override, else the GGUF's) and, with layers on a GPU, warms the context up so
  the first turn's TTFT carries no one-time cost.
- Every turn renders the full prompt (the template over [system, history...,
  user]; a reply this model sampled stands as its sampled tokens,
  `ChatMessage.tokens`, where the template allows, so the prompt matches the
  KV state kept after it) and starts from the state sharing the longest token prefix with it:
  the live context, else the prompt cache's RAM tier, else its disk tier
  (`chatterm.core.cache.prompt_cache`); a cached state must beat the live context by
  MIN_REUSE tokens to be worth a restore. The state is trimmed to the shared
  prefix and only the rest is prefilled, in batches, with progress in
  `Turn.prefill_progress` and a cancel honoured within one batch.
- The persona's shareable prefix (`templates.persona_prefix`) is one entry of
  that cache: prefilled once, captured, kept in RAM and written to disk in the
  background. A template that puts the system prompt late gets no persona
  entry, and the turn says why.
- A conversation's state is kept (`keep_conversation`, called when a turn has
  been recorded): captured in a few ms, kept in RAM, written to disk by the
  cache's background writer; so is a history an idle, empty-draft
  `prefill_ahead` filled whole (a version gone back to with ←), while its
  session is still the one noted. `note_conversation` says which session the
  next turn continues, so a missing or stale state of that session is named.
- Labels are honest: `cache_outcome` is RESTORED (from RAM or disk), MEMORY
  (the live context) or COLD (fewer than MIN_REUSE tokens reused), and
  `cache_detail` says what was reused (persona prefix / conversation of N
  tokens / live context / nothing), how many tokens, and every miss's reason.
- A turn waits for the context (a persona being prepared, a type-ahead
  batch: `chatterm.core.engine.local.context_gate`); a cancel while it waits
  ends it within LOCK_POLL_S, and what it waited for goes on (a persona
  prefill is the persona's work: the next turn reuses it). Such a turn reused
  and prefilled nothing: `CacheOutcome.NONE`.
- "Saved" prefill time (`chatterm.core.engine.local.outcome.saved_prefill_ms`)
  is the reused tokens at the fastest prefill rate known (measured here, this
  turn's own prefill included, or stored with a restored state), net of what
  the turn spent getting them: its restore and the time it waited
  (`wait_ms`); 0 for a turn stopped before its prefill ended.
- Each prefill, and the decode after it, runs on the threads
  `chatterm.core.engine.local.model.Threads` picks: one per physical core,
  fewer while other processes keep cores busy, looked at again every
  `RECHECK_TOKENS` tokens of the reply.
- Metrics are exact: TTFT from submit to the first sampled token; decode
  tokens/s from first to last token; a turn stopped during its prefill keeps
  the time that prefill ran and the tokens it did; llama.cpp's own perf counters for the
  turn are kept in `Turn.perf` (tests compare the two).
- When the prompt would not fit n_ctx (leaving room for the reply), the oldest
  whole turns are left out (never the persona) at a cut that holds for
  several turns (`chatterm.core.engine.local.prompt_fit`; the cut is
  remembered, and saved with the conversation's state). The overflow policy
  (`context_overflow`, `kv_shift.overflow_policy`) says what the KV state
  does when the cut moves: under SHIFT the left-out turns are removed from
  the live (or restored) state and what follows is shifted, so the kept
  turns are not prefilled again; under TRUNCATE the kept turns are prefilled
  once, and reused until the cut moves again. A turn whose cut moved says so
  (`cut_turns`, `shifted_tokens`, `shift_ms`, a notice).
- `prefill_ahead` prefills the prompt a send of the draft would have, in the
  live context, yielding to a turn; its state and the credit a turn gets for
  it (`ahead_tokens`) are `chatterm.core.engine.local.type_ahead`'s. The
  part of that credit before the history's end (`ahead_history_tokens`:
  the conversation prefilled again after a model switch or a fork) is told
  apart from the message typed ahead.
- A sampled reply records its seed (`TurnMetrics.seed`): pinned in the
  persona, it samples the reply again.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import logging
import secrets
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Iterator, Sequence

import llama_cpp

from chatterm.core.cache.prompt_cache import RAM, Candidate, Miss, PromptCache, Slot
from chatterm.core.cache.tokens import common_prefix_len
from chatterm.core.config.catalog import ModelSpec, PriceProfile
from chatterm.core.config.personas import Persona, Sampling
from chatterm.core.engine.context_window import Overflow, shift_span, turn_starts
from chatterm.core.engine.interface import (
    AheadReport,
    ChatMessage,
    DeviceInfo,
    Engine,
    EngineCapabilities,
    PrefillProgress,
    PrefixReport,
    Progress,
    Turn,
    reply_room,
)
from chatterm.core.engine.local import kv_shift, kv_state, offload, templates
from chatterm.core.engine.local.context_gate import ContextGate
from chatterm.core.engine.local.early_load import EarlyLoad
from chatterm.core.engine.local.model import RECHECK_TOKENS, AbortFlag, Threads, open_model
from chatterm.core.engine.local.outcome import (
    MIN_REUSE,
    PrefillRate,
    PreparedPersona,
    Reuse,
    classify,
    saved_prefill_ms,
    started_from,
    switch_label,
)
from chatterm.core.engine.local.prompt_fit import MEMO_LIMIT, Fitted, PromptFitter
from chatterm.core.engine.local.type_ahead import AheadCredit, TypeAhead
from chatterm.core.metrics.turn_metrics import CacheOutcome, StopReason, TurnMetrics
from chatterm.core.system.file_identity import sha256_of_file
from chatterm.errors import ChattermError

log = logging.getLogger(__name__)

_NOBODY = object()
"""`LocalEngine._live_session` of a context that holds no conversation's turns."""

def _perf_counters(llm: llama_cpp.Llama) -> dict[str, float]:
    """llama.cpp's own counters for the context since its last perf reset."""
    perf = llama_cpp.llama_perf_context(llm.ctx)
    return {
        "t_p_eval_ms": perf.t_p_eval_ms,
        "n_p_eval": perf.n_p_eval,
        "t_eval_ms": perf.t_eval_ms,
        "n_eval": perf.n_eval,
    }


class _StopFlag:
    """`threading.Event`-like view of a turn's cancel, for kv_state.prefill."""

    def __init__(self, turn: Turn):
        self._turn = turn

    def is_set(self) -> bool:
        return self._turn.cancelled


class LocalEngine(Engine):
    kind = "local"
    capabilities = EngineCapabilities(persona_cache=True, kv_control=True, prefill_ahead=True)

    def __init__(self, spec: ModelSpec, price: PriceProfile, kv_cache: PromptCache | None = None,
                 early: EarlyLoad | None = None):
        super().__init__(spec, price)
        self.kv_cache = kv_cache
        """The prompt cache (persona prefixes and conversations); None: no caching."""
        self._early = early
        """The model file's load begun with the engine (`Workspace.make_engine`), taken at `load`."""
        self.llm: llama_cpp.Llama | None = None
        self.plan: offload.OffloadPlan | None = None
        self.load_notes: list[str] = []
        self.template: templates.ChatTemplate | None = None
        self._model_sha256 = ""
        self._compat: dict[str, Any] = {}
        self._prefixes: dict[str, templates.PersonaPrefix] = {}
        self._sampled_checked: dict[tuple[str, bytes], bool] = {}
        """Whether a reply's sampled tokens spell its text, per (text, tokens):
        a long history is decoded once, not on every keystroke of type-ahead."""
        self._prepared: PreparedPersona | None = None
        """The persona prefix prepare_persona made ready and no turn has used
        yet; cleared whenever the context is cleared."""
        self._session: int | None = None
        """The session the next turn continues (note_conversation)."""
        self._live_session: object = _NOBODY
        """Whose turns the live context holds: a session id, None for a
        conversation not stored (yet), `_NOBODY` for none (cleared, a persona
        alone, a state just restored). Only that conversation may shift it."""
        self._gate = ContextGate(self._lock, AbortFlag())
        """Who holds the context, and how a turn or a cancel makes it let go."""
        self._ahead = TypeAhead(self._gate.turn_waiting)
        self._cache_warned = False
        self._rate = PrefillRate()
        """The fastest prefill rate known, for "saved" estimates."""
        self._device_name = ""
        """The GPU or CPU name, worked out once at load (a GPU probe is not free)."""
        self._anchor = ""
        """Where the conversation's prompt starts once it outgrew the context
        (`context_window.anchor_of` its first kept message); "" when it starts at the beginning."""
        self.overflow = Overflow.TRUNCATE
        self.overflow_reason = ""

    # -- loading ---------------------------------------------------------
    def load(self, progress: Progress | None = None) -> None:
        path = self.spec.model_path()
        # Sampling other processes starts now, so the first prefill knows their load.
        threads = Threads(adapt_decode=self.spec.n_threads is None, adapt_batch=self.spec.n_threads_batch is None)
        if self._early is not None:
            self._early.progress = progress
        try:
            opened = open_model(self.spec, progress)
        except BaseException:
            threads.close()
            raise
        finally:
            self._close_early()
        threads.bind(opened.llm)
        threads.apply()  # a warm-up decode too: not on a core another process holds
        self._threads = threads
        self.llm, self.plan, self._device_name = opened.llm, opened.plan, opened.device_name
        self.load_notes = list(opened.notes)
        self._model_sha256 = sha256_of_file(path)
        self._compat = kv_state.compat_fields(self.llm, path, self._model_sha256, self.plan.flash_attn)
        base_dir = self.spec.defined_in.parent if self.spec.defined_in is not None else None
        try:
            self.template = templates.template_for(self.llm, self.spec.id, self.spec.chat_template, base_dir)
        except ChattermError:
            threads.close()
            self.llm.close()
            self.llm = None
            raise
        self._vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self._piece = ctypes.create_string_buffer(64)
        self.overflow, self.overflow_reason = kv_shift.overflow_policy(self.spec.context_overflow, self.llm)
        llm = self.llm
        self._fitter = PromptFitter(
            llm.n_ctx(),
            self._prompt_tokens,
            lambda text: llm.tokenize(text.encode("utf-8"), add_bos=False, special=False),
            lambda tokens: llm.detokenize(tokens).decode("utf-8", "ignore"),
            self.spec.id,
            lambda persona: len(self.prefix_tokens(persona)),
        )
        self._gate.abort.install(self.llm)
        if opened.on_gpu:
            self._warm_up()
        if progress is not None:
            progress(1.0)

    def _warm_up(self) -> None:
        """Decode a short batch and a single token, then forget them: with
        layers on a GPU the first decode of a fresh context carries a one-time
        cost (kernel loading). On the CPU it is within noise of nothing (at
        most ~10 ms of turn one) against the 33-48 ms this takes at every
        load, so a model on the CPU skips it (docs/engine.md)."""
        llm = self.llm
        assert llm is not None
        tokens = llm.tokenize(b"Hello, warm up.", add_bos=False, special=False)[:8] or [0]
        llm.eval(tokens)
        llm.eval(tokens[:1])
        # llama.cpp books decode time into its perf counters only at the next
        # synchronize; without this the warm-up would be charged to turn one.
        llama_cpp.llama_synchronize(llm.ctx)
        self._clear_context()

    def _context_replaced(self) -> None:
        """What was prepared or prefilled ahead in the context is gone (it was
        cleared, restored over, trimmed to a persona, or is being prepared)."""
        self._prepared = None
        self._ahead.forget()
        self._live_session = _NOBODY

    def _clear_context(self) -> None:
        llm = self.llm
        assert llm is not None
        self._context_replaced()
        kv_state.clear(llm)
        self._gate.abort.release()  # a pending shift went with the cells

    # -- information -----------------------------------------------------
    @property
    def model_identity(self) -> str:
        return self._model_sha256 or self.spec.id

    def device(self) -> DeviceInfo:
        plan = self.plan
        llm = self.llm
        n_layer = llama_cpp.llama_model_n_layer(llm.model) if llm is not None else None
        offloaded = (plan.layers_offloaded(n_layer) if plan is not None else 0) or 0
        return DeviceInfo(
            backend="GPU" if offloaded > 0 else "CPU",
            name=self._device_name,
            n_layers=n_layer,
            layers_offloaded=offloaded,
            kv_type=self.spec.kv_type,
            flash_attn=plan.flash_attn if plan else None,
            n_ctx=llm.n_ctx() if llm is not None else self.spec.n_ctx,
            notes=list(self.load_notes),
            overflow=f"{self.overflow.value} ({self.overflow_reason})" if self.overflow_reason else "",
            threads=self._threads.describe() if llm is not None else "",
        )

    def context_used(self) -> int:
        return self.llm.n_tokens if self.llm is not None else 0

    def persona_tokens(self, persona: Persona) -> int | None:
        prefix = self._prefixes.get(persona.fingerprint)
        return len(prefix.tokens) if prefix is not None else None

    def persona_misfit(self, persona: Persona) -> str | None:
        try:
            self._fitter.check_room(persona, persona.sampling.max_tokens)
        except ChattermError:  # its one line is what preparing it says
            return (f"{len(self.prefix_tokens(persona)):,} tokens: more than the "
                    f"{self._fitter.n_ctx:,}-token context holds")
        return None

    def cached_personas(self) -> dict[str, str]:
        found: dict[str, str] = {}
        if self.kv_cache is None:
            return found
        for entry in self.kv_cache.entries(self.spec.id):
            if entry.slot.kind == "persona" and not entry.problem and found.get(entry.slot.key) != RAM:
                found[entry.slot.key] = entry.tier
        return found

    # -- tokens ----------------------------------------------------------
    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """The token's text bytes (control tokens give b"", unless `special`:
        then their text, "<|im_start|>").

        llama-cpp-python's `token_to_piece` returns its whole 32-byte buffer,
        NUL padding included, so we call llama.cpp with the returned length."""
        n = llama_cpp.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, special)
        if n < 0:  # buffer too small: -n is the size needed
            self._piece = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, special)
        return self._piece.raw[:n]

    def persona_prefix(self, persona: Persona) -> templates.PersonaPrefix:
        """The persona's shareable token prefix under this model's template."""
        key = persona.fingerprint
        if key not in self._prefixes:
            assert self.llm is not None and self.template is not None
            self._prefixes[key] = templates.persona_prefix(self.template, self.llm, persona.system_prompt)
        return self._prefixes[key]

    def prefix_tokens(self, persona: Persona) -> list[int]:
        return self.persona_prefix(persona).tokens

    def _prompt_tokens(self, persona: Persona, history: Sequence[ChatMessage], user_text: str) -> list[int]:
        assert self.llm is not None and self.template is not None
        messages = [{"role": "system", "content": persona.system_prompt}]
        messages += [{"role": m.role, "content": m.content} for m in history]
        messages.append({"role": "user", "content": user_text})
        known = {i: m.tokens.ids for i, m in enumerate(history, start=1) if self._sampled_here(m)}
        return self.template.tokens(self.llm, messages, known)

    def _sampled_here(self, message: ChatMessage) -> bool:
        """`message` carries the tokens this model sampled for its text, exactly
        (a reply cut short inside a character does not: its text ends in
        U+FFFD where the tokens hold the character's first bytes)."""
        tokens = message.tokens
        if tokens is None or tokens.model_identity != self.model_identity:
            return False
        key = (message.content, tokens.data)
        verdict = self._sampled_checked.get(key)
        if verdict is None:
            if len(self._sampled_checked) >= MEMO_LIMIT:
                self._sampled_checked.clear()
            # Byte for byte, control tokens spelled out: a control token the
            # reply's text shows as nothing, or a character cut in two that it
            # shows as U+FFFD, would make a prompt other than the text's.
            spelled = b"".join(self.token_bytes(t, special=True) for t in tokens.ids)
            verdict = self._sampled_checked[key] = spelled == message.content.encode("utf-8")
        return verdict

    def fit_prompt(
        self, persona: Persona, history: Sequence[ChatMessage], user_text: str, max_tokens: int
    ) -> Fitted:
        """The prompt tokens that fit n_ctx with room for the reply, cut where the
        conversation's cached state is (see the contract)."""
        # Under SHIFT a cut that moves costs a shift, not a prefill: the newest turn may stay.
        return self._fitter.fit(persona, history, user_text, max_tokens, self._anchor,
                                keep_newest=self.overflow is Overflow.SHIFT)

    # -- the prompt cache ------------------------------------------------
    def _live_tokens(self) -> list[int]:
        llm = self.llm
        assert llm is not None
        return llm.input_ids[: llm.n_tokens].tolist()

    def _reuse(self, target: list[int], use_cache: bool, expect: Sequence[Slot] = (), keep: int = 0) -> Reuse:
        """Start the context from the state sharing the longest prefix with `target`
        (live context, RAM, disk), trimmed to that prefix. At least one token of
        `target` is always left to decode. Under SHIFT, a state of `expect` (the
        conversation) whose oldest turns after the first `keep` tokens (the
        persona) the prompt left out counts with those turns removed."""
        llm = self.llm
        assert llm is not None
        limit = max(len(target) - 1, 0)
        shifted, shift_ms = self._shift_live(target, keep)
        live = min(common_prefix_len(self._live_tokens(), target), limit)
        misses: list[str] = []
        cache = self.kv_cache if use_cache else None
        if cache is not None:
            t0 = time.perf_counter()
            shifting = self.overflow is Overflow.SHIFT and keep > 0 and bool(expect)
            found = cache.lookup(self.spec.id, self._compat, target,
                                 min_shared=1 if shifting else live + MIN_REUSE, expect=expect)
            misses += found.misses
            plans: list[tuple[int, int, Any]] = []
            for candidate in found.candidates:
                span, shared = 0, candidate.shared
                if shifting and candidate.entry.slot in expect:
                    after = shift_span(candidate.entry.tokens, target, keep)
                    if after is not None and min(after[1], limit) > shared:
                        span, shared = after[0], min(after[1], limit)
                if shared >= live + MIN_REUSE:
                    plans.append((shared, span, candidate))
            plans.sort(key=lambda plan: -plan[0])  # stable: the lookup's tier order among equals
            for shared, span, candidate in plans:
                entry = candidate.entry
                # A shift needs the whole state; so does a file (the cache may
                # hand out only the shared part of a chain of blocks).
                cells = len(entry.tokens) if span or entry.chain is None else candidate.shared
                own = entry.model_id == self.spec.id  # else another entry's, for the same file and settings
                if cells > llm.n_ctx():  # a state from a larger context: fine there, kept
                    if own:
                        misses.append(f"{entry.slot.label} ({entry.tier}): {cells:,} tokens do not fit "
                                      f"this {llm.n_ctx():,}-token context")
                    continue
                opened = cache.open(Candidate(entry, len(entry.tokens)) if span else candidate)
                if isinstance(opened, Miss):
                    misses.append(opened.reason)
                    continue
                try:
                    reason = kv_state.restore(llm, opened.payload, opened.tokens, opened.verify)
                finally:
                    opened.close()
                self._context_replaced()  # emptied, if the restore failed
                if reason is None and span:
                    t_shift = time.perf_counter()
                    if self._shift(keep, span):
                        shifted, shift_ms = span, (time.perf_counter() - t_shift) * 1000.0
                    else:
                        reason = "the memory refused to shift"
                if reason is None and kv_state.trim(llm, shared):
                    ms = (time.perf_counter() - t0) * 1000.0 - shift_ms
                    self._rate.adopt(entry.info.get("prefill_ms_per_token"))
                    return Reuse(entry.tier, llm.n_tokens, entry.slot, ms, misses, entry.info, shifted, shift_ms,
                                 saved_by=entry.model_id if entry.model_id != self.spec.id else "")
                reason = reason or "the memory cannot drop a suffix"
                misses.append(f"{entry.slot.label} ({entry.tier}): rejected: {reason}")
                if own:  # another entry's state may be fine in its own context
                    cache.discard(entry, reason)
                live, shifted, shift_ms = 0, 0, 0.0  # a failed restore leaves an empty context
        if not kv_state.trim(llm, live):
            live = 0
        return Reuse("live" if live else "", llm.n_tokens, misses=misses, shifted=shifted, shift_ms=shift_ms)

    def _shift(self, keep: int, span: int) -> bool:
        """`kv_shift.shift`, with the abort flag held until the next decode has
        rotated the moved keys (`AbortFlag.hold`): a turn's Enter stopping a
        type-ahead batch at that moment corrupted them. That decode is one
        token (`_rotation_batch`), so a stop waits milliseconds, not a batch."""
        llm = self.llm
        assert llm is not None
        if not kv_shift.shift(llm, keep, span):
            return False
        self._gate.abort.hold()
        return True

    def _rotation_batch(self) -> int | None:
        """The next prefill's first batch size: one token while a shift's
        rotation is pending (the abort is held through that decode), else None."""
        return 1 if self._gate.abort.held else None

    def _shift_live(self, target: list[int], keep: int) -> tuple[int, float]:
        """Under SHIFT, remove from the live context the turns after its first
        `keep` tokens that `target` left out; (tokens removed, ms)."""
        llm = self.llm
        assert llm is not None
        if self.overflow is not Overflow.SHIFT or keep <= 0 or self._live_session != self._session:
            return 0, 0.0  # another conversation's turns: their KV must not carry over
        live = self._live_tokens()
        now = common_prefix_len(live, target)
        if now >= len(live):
            return 0, 0.0  # the context is a prefix of the prompt: nothing left out
        after = shift_span(live, target, keep)
        if after is None or after[1] < now + MIN_REUSE:
            return 0, 0.0
        t0 = time.perf_counter()
        if not self._shift(keep, after[0]):
            return 0, 0.0
        return after[0], (time.perf_counter() - t0) * 1000.0

    def _keep(self, slot: Slot, info: dict[str, Any]) -> None:
        """Capture the live context as `slot`'s entry: RAM now, disk in the background."""
        llm = self.llm
        assert llm is not None and self.kv_cache is not None
        state = kv_state.capture(llm)
        info = {**info, "state_size": state.nbytes}
        if self._rate.ms_per_token is not None:
            info.setdefault("prefill_ms_per_token", self._rate.ms_per_token)
        self.kv_cache.put(self.spec.id, slot, state.tokens, state.payload, self._compat, info)

    def _prefill(self, tokens: list[int], turn: Turn | None = None, done_before: int = 0,
                 total: int | None = None, t0: float | None = None,
                 report: Callable[[PrefillProgress], None] | None = None,
                 skipped: int = 0) -> kv_state.PrefillResult:
        """Evaluate `tokens` after the context, batch by batch; progress goes to
        `turn.prefill_progress` and `report` (counting from `done_before` of
        `total`, since `t0`; `skipped` of those were in the context already)."""
        llm = self.llm
        assert llm is not None
        total = total if total is not None else len(tokens)
        t0 = t0 if t0 is not None else time.perf_counter()

        def on_progress(p: PrefillProgress) -> None:
            # Between batches too: the load sampler lags a process that just
            # ended by up to a second, and one count for a whole long prompt ran
            # it on one core of two for 20 s after llama-server's turn.
            self._threads.apply()
            progress = PrefillProgress(done_before + p.done, total, time.perf_counter() - t0,
                                       p.batch, p.batch_s, p.offset - done_before, skipped)
            if turn is not None:
                turn.prefill_progress = progress
            if report is not None:
                report(progress)

        self._threads.apply()
        result = kv_state.prefill(llm, tokens, on_progress, _StopFlag(turn) if turn is not None else None,
                                  decoded=self._gate.abort.release, first=self._rotation_batch())
        self._rate.measured(result.ms, result.done)
        return result

    def _ensure_persona(
        self,
        persona: Persona,
        use_cache: bool = True,
        turn: Turn | None = None,
        report: Callable[[PrefillProgress], None] | None = None,
    ) -> PrefixReport:
        """Make the persona's shareable prefix the start of the context."""
        pp = self.persona_prefix(persona)
        prefix = pp.tokens
        if not pp.helps or len(prefix) < MIN_REUSE:
            self._clear_context()
            why = pp.reason or f"persona prefix too short to cache ({len(prefix)} tokens)"
            return PrefixReport(CacheOutcome.COLD, 0.0, 0, why)
        reuse = self._reuse(prefix + [-1], use_cache)  # -1: no token, so all of `prefix` may be reused
        detail = "; ".join(reuse.misses)
        if reuse.tokens == len(prefix):
            if reuse.restored:
                return PrefixReport(CacheOutcome.RESTORED, reuse.ms, len(prefix), detail, reuse.source)
            return PrefixReport(CacheOutcome.MEMORY, 0.0, len(prefix), detail)
        t0 = time.perf_counter()
        # Counted against the whole prefix, as the report is: the tokens already
        # in the context (a template's opening) are done from the start.
        self._prefill(prefix[reuse.tokens :], turn, reuse.tokens, len(prefix), t0, report, reuse.tokens)
        ms = (time.perf_counter() - t0) * 1000.0
        if use_cache and self.kv_cache is not None and self.kv_cache.write_error is None:
            self._keep(Slot.persona(persona.id), {"prefill_ms": ms})
            detail = f"{detail}; state saved for next time" if detail else "state saved for next time"
        return PrefixReport(CacheOutcome.COLD, ms, len(prefix), detail)

    def wait_for_saves(self) -> None:
        """Block until background state-file writes are done (CLI exit, tests)."""
        if self.kv_cache is not None:
            self.kv_cache.flush()

    def _session_slot(self, session_id: int) -> Slot:
        return self.kv_cache.session_slot(session_id) if self.kv_cache is not None else Slot.session(session_id)

    def note_conversation(self, session_id: int | None) -> None:
        if session_id != self._session:
            if session_id is not None and self.kv_cache is not None:
                # Its state will be restored at the next turn: the memory that
                # takes is faulted in now, beside the model's load or the typing.
                threading.Thread(target=self.kv_cache.reserve, args=(self.spec.id, self._session_slot(session_id)),
                                 name="chatterm-reserve", daemon=True).start()
            self._anchor = self._saved_anchor(session_id)
        self._session = session_id

    def _saved_anchor(self, session_id: int | None) -> str:
        """Where session `session_id`'s cached state starts its history ("": the beginning)."""
        if session_id is None or self.kv_cache is None:
            return ""
        slot = self._session_slot(session_id)
        # This model's own state first, else another entry's it can restore
        # (`PromptCache.lookup`). Before the load (`chatterm ask` notes its
        # session meanwhile) the compat is not known: the other folders' records
        # are not read then, beside the imports the load overlaps.
        entries = self.kv_cache.entries(None if self._compat else self.spec.id)
        usable = [e for e in entries if e.slot == slot and not e.problem
                  and (e.model_id == self.spec.id or e.compat == self._compat)]
        entry = min(usable, key=lambda e: e.model_id != self.spec.id, default=None)  # the model's own first
        anchor = entry.info.get("context_anchor", "") if entry is not None else ""
        return anchor if isinstance(anchor, str) else ""

    def keep_conversation(self, session_id: int) -> None:
        """Keep the live context as session `session_id`'s conversation state."""
        self._session = session_id
        self._live_session = session_id  # a first turn's conversation has its id now
        if self.kv_cache is None:
            return
        # Called from a turn's finish callbacks: a consumer that abandoned the
        # stream may still hold the generation (and its lock) on this thread, and
        # a busy engine has moved on anyway; either way there is nothing to keep.
        if not self._gate.lock.acquire(blocking=False):
            return
        try:
            if self.llm is not None and self.llm.n_tokens >= MIN_REUSE:
                self._keep(self._session_slot(session_id), {"context_anchor": self._anchor})
        finally:
            self._gate.lock.release()

    def interrupt(self) -> None:
        running = self._gate.running
        if running is not None:
            running.cancel()
        self._gate.abort.set(True)

    def prepare_persona(
        self, persona: Persona, progress: Callable[[PrefillProgress], None] | None = None
    ) -> PrefixReport:
        gate = self._gate
        with gate.lock:
            gate.abort.set(False)
            gate.preparing = persona.id
            self._context_replaced()  # it is made the persona's (`_prepared` is set again below)
            try:
                self.persona_prefix(persona)  # measured first: the dashboard shows its size
                self._fitter.check_room(persona, persona.sampling.max_tokens)
                report = self._ensure_persona(persona, report=progress)
            except RuntimeError:
                if not gate.abort.is_set:
                    raise
                self._clear_context()
                raise ChattermError(f"preparing persona {persona.id!r} was interrupted") from None
            finally:
                gate.preparing = None
                gate.abort.set(False)
            self._prepared = PreparedPersona(persona.fingerprint, report)
            return report

    def cache_notice(self) -> str | None:
        """One notice, once, when state files cannot be written."""
        if self.kv_cache is not None and self.kv_cache.write_error and not self._cache_warned:
            self._cache_warned = True
            return (f"Prompt cache on disk off: {self.kv_cache.write_error}. "
                    "Chat continues; states are kept in memory only.")
        return None

    # -- turns -----------------------------------------------------------
    def start_turn(
        self, persona: Persona, history: Sequence[ChatMessage], user_text: str, *, use_cache: bool = True
    ) -> Turn:
        """A turn over the persona's prefix, `history` and `user_text`.
        `use_cache=False` neither restores nor saves a persona state (benchmarks)."""
        metrics = TurnMetrics(
            engine=self.kind,
            model_id=self.spec.id,
            persona_id=persona.id,
            submitted_at=time.time(),
        )
        history = list(history)
        turn = Turn(
            metrics, self.price, lambda t: self._generate(t, persona, history, user_text, use_cache)
        )
        turn.on_cancel(lambda: self._gate.abort_if_running(turn))  # interrupts a prefill in progress
        return turn

    def reset_context(self, keep: Persona | None = None) -> None:
        """Forget the context; with `keep`, keep that persona's prefix when it is
        there (a new conversation with the same persona). Waits for a running turn."""
        with self._gate.lock:
            assert self.llm is not None
            self._anchor = ""
            prefix = self.prefix_tokens(keep) if keep is not None else []
            if prefix and self._live_tokens()[: len(prefix)] == prefix and kv_state.trim(self.llm, len(prefix)):
                self._context_replaced()
            else:
                self._clear_context()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[llama_cpp.Llama]:
        """The underlying `llama_cpp.Llama`, alone, for measuring the bare library
        against chatterm on the same loaded model; the context is cleared after."""
        with self._gate.lock:
            assert self.llm is not None
            self._gate.abort.set(False)
            self._clear_context()
            try:
                yield self.llm
            finally:
                self._clear_context()

    # -- type-ahead ----------------------------------------------------------
    def prefill_ahead(
        self,
        persona: Persona,
        history: Sequence[ChatMessage],
        draft: str,
        progress: Callable[[int, int], None] | None = None,
        session_id: int | None = None,
    ) -> AheadReport | None:
        ahead, gate = self._ahead, self._gate
        if self.llm is None or gate.turn_waiting.is_set():
            return None
        if not gate.lock.acquire(blocking=False):
            return None  # a turn (or a persona switch) has the context
        epoch = ahead.epoch
        try:
            if ahead.stopped(epoch):
                return None
            gate.abort.set(False)
            ahead.running = True
            return self._prefill_ahead(persona, list(history), draft, progress, epoch, session_id)
        except RuntimeError:
            if gate.abort.is_set:
                return None  # a turn or drop_ahead() interrupted the batch
            raise
        finally:
            ahead.running = False
            gate.lock.release()

    def _prefill_ahead(
        self,
        persona: Persona,
        history: list[ChatMessage],
        draft: str,
        progress: Callable[[int, int], None] | None,
        epoch: int,
        session_id: int | None,
    ) -> AheadReport | None:
        llm = self.llm
        assert llm is not None
        prefix = self.prefix_tokens(persona)
        live = self._live_tokens()
        if not prefix or live[: len(prefix)] != prefix:
            return None  # the persona is being prepared (switch or first turn)
        target, total, dropped = self._ahead_tokens(persona, history, draft)
        if target[: len(prefix)] != prefix:
            return None  # the template does not start with the persona prefix
        keep = len(prefix) if dropped else 0  # as a turn shifts: only for turns its prompt leaves out
        session = session_id if session_id is not None else self._session  # whose history this is
        if not self._ahead.began:
            # The first prefill since the last turn: a stored state may hold more
            # of the prompt than the context does (a resumed conversation, whose
            # state is restored instead of prefilled again while the user types).
            expect = [self._session_slot(session)] if session is not None else []
            # The history alone (nothing typed) needs no logits: its restore may
            # cover it whole (`_reuse` leaves a prompt's last token to decode),
            # which a token past it that matches nothing allows.
            reuse = self._reuse(target if draft else [*target, -1], True, expect, keep)
            self._ahead.note_shift(reuse.shifted, reuse.shift_ms, len(prefix))
            live = self._live_tokens()
            if live[: len(prefix)] != prefix:
                return None  # a restore failed and emptied the context: the turn starts over
            if reuse.restored:
                self._ahead.restored = replace(reuse, ahead=True)
        elif (shift := self._shift_live(target, keep))[0]:
            self._ahead.note_shift(*shift, len(prefix))
            live = self._live_tokens()  # the turns the next prompt leaves out are gone
        self._threads.apply()

        def on_batch(done: int, of: int) -> None:
            self._threads.apply()  # between batches, as a turn's prefill does
            if progress is not None:
                progress(done, of)

        already = common_prefix_len(live, target)
        report = self._ahead.prefill(llm, live, target, total, on_batch, epoch, self._gate.abort.release,
                                     self._rotation_batch())
        if report is not None:  # the context holds this history now (a caller that named none: the noted one's)
            self._live_session = session
        if (not draft and report is not None and report.ready == len(target) > already
                and session_id is not None and session_id == self._session and self.kv_cache is not None):
            # The history on screen (a version gone back to with ←, a fork) now
            # fills the context: it becomes the session's state, so a switch
            # away and back restores this branch, not its last turn's. Only its
            # own session's: another one opened meanwhile keeps the state it has.
            self._keep(self._session_slot(session_id), {"context_anchor": self._anchor})
        return report

    def _ahead_tokens(
        self, persona: Persona, history: list[ChatMessage], draft: str
    ) -> tuple[list[int], int, int]:
        """(the tokens to prefill for `draft`, the length of its whole prompt,
        the oldest turns of `history` it leaves out).

        All but the last token of the prompt a send of the draft would have,
        template closing tokens included, so Enter leaves one token to decode.
        When the user types on, the draft's last tokens may change ("hel" +
        "lo" is one token) and the closing tokens move: the next call keeps the
        longest common prefix and re-prefills only the few tokens after it.
        An empty draft (nothing typed yet) gives the history alone, up to where
        a message would open, found with a one-letter stand-in as a turn's
        credit is split: none of it is then counted as the message typed ahead."""
        try:
            fitted = self.fit_prompt(persona, history, draft or "x", persona.sampling.max_tokens)
        except ChattermError:
            return [], 0, 0  # the persona alone fills the context: nothing to do ahead
        if not draft:
            end = self._fitter.history_end(persona, history, fitted)
            return fitted.tokens[:end], end, fitted.dropped_turns
        return fitted.tokens[:-1], len(fitted.tokens), fitted.dropped_turns

    def drop_ahead(self) -> None:
        if self._ahead.drop():
            self._gate.abort.set(True)  # stops the batch in progress; cleared by the lock's next user

    def _generate(
        self, turn: Turn, persona: Persona, history: list[ChatMessage], user_text: str, use_cache: bool
    ) -> Iterator[str]:
        gate = self._gate
        # A type-ahead prefill holding the lock stops within its current batch.
        gate.turn_waiting.set()
        if self._ahead.running:
            gate.abort.set(True)
        if not gate.acquire_for(turn):
            gate.turn_waiting.clear()
            busy_with = gate.preparing
            turn.stopped_waiting(
                f"stopped while waiting for the engine to prepare persona {busy_with!r} (that goes on)"
                if busy_with is not None else "stopped while waiting for the engine"
            )
            return
        try:
            turn.engine_started()
            gate.turn_waiting.clear()
            if self.llm is None:
                raise ChattermError("the model is not loaded")
            if turn.cancelled:
                turn.stopped_waiting("stopped before the engine started it")
                return
            gate.abort.set(False)
            gate.running = turn
            try:
                yield from self._run_turn(turn, persona, history, user_text, use_cache)
            except RuntimeError:
                if not turn.cancelled:
                    raise
                # llama_decode returned 2: the prefill was aborted by cancel().
            finally:
                gate.running = None
                gate.abort.set(False)
            if turn.cancelled and not turn.metrics.stop_reason:
                turn.metrics.stop_reason = StopReason.CANCELLED
        finally:
            gate.lock.release()

    def _run_turn(
        self, turn: Turn, persona: Persona, history: list[ChatMessage], user_text: str, use_cache: bool
    ) -> Iterator[str]:
        """Fit the prompt, start from the state sharing most of it, prefill the
        rest and stream the reply sampled after it."""
        llm = self.llm
        assert llm is not None
        m = turn.metrics
        llama_cpp.llama_synchronize(llm.ctx)
        llama_cpp.llama_perf_context_reset(llm.ctx)
        fitted = self.fit_prompt(persona, history, user_text, persona.sampling.max_tokens)
        tokens, m.dropped_turns, m.cut_turns = fitted.tokens, fitted.dropped_turns, fitted.moved_turns
        self._anchor = fitted.anchor
        pp = self.persona_prefix(persona)
        prepared, self._prepared = self._prepared, None
        expect = [self._session_slot(self._session)] if self._session is not None else []
        # A shift is for turns this prompt left out. Without that it would give a
        # new conversation whose message matches a later one of the context's
        # conversation that message's KV, computed with the earlier turns in view.
        keep = len(pp.tokens) if pp.helps and fitted.dropped_turns else 0
        reuse = self._reuse(tokens, use_cache, expect, keep)
        self._live_session = self._session  # the context is this turn's prompt from here on
        if reuse.source == "live" and self._ahead.shifted and reuse.tokens > self._ahead.shift_keep:
            # Going on in the context type-ahead shifted while the message was
            # typed: that shift is this turn's (its notice, detail and figures).
            reuse = replace(reuse, shifted=reuse.shifted + self._ahead.shifted,
                            shift_ms=reuse.shift_ms + self._ahead.shift_ms)
        m.shifted_tokens, m.shift_ms = reuse.shifted, reuse.shift_ms
        if fitted.moved_turns:
            left = fitted.dropped_turns == len(turn_starts([m.role for m in history]))
            turn.notices.append(self._cut_notice(fitted.moved_turns, reuse.shifted, left,
                                                 persona.sampling.max_tokens))
        turn.notices.extend(fitted.notices)
        credit = self._record_start(m, persona, pp, reuse, prepared, len(tokens))
        try:
            t_prefill = time.perf_counter()
            if not self._prefill_prompt(turn, persona, pp, tokens, use_cache, t_prefill):
                return
            # Worked out after this turn's own prefill, whose rate counts: a fresh
            # process would otherwise have only the rate stored with the restored
            # state, which may have been measured while the machine was busy.
            m.saved_prefill_ms = saved_prefill_ms(
                m.reused_tokens, self._rate.ms_per_token, m.restore_ms, m.wait_ms, m.restore_at_switch
            )
            notice = self.cache_notice()
            if notice:
                turn.notices.append(notice)
            yield from self._sample(turn, persona.sampling, tokens, t_prefill)
        finally:
            if credit is not None:
                # Split at the history's end: after a model switch or a fork the
                # conversation so far was prefilled again while the message was
                # typed, and that is not typing ahead. Worked out after the reply:
                # it renders the prompt once more (16 ms at 5,000 tokens), which
                # would otherwise be part of the TTFT.
                m.ahead_history_tokens = credit.before(self._fitter.history_end(persona, history, fitted))

    def _cut_notice(self, turns: int, shifted: int, none_left: bool, max_tokens: int) -> str:
        n_ctx = self.llm.n_ctx() if self.llm is not None else self.spec.n_ctx
        # The room kept for the reply is said: beside "1,557 / 2,048" on the
        # dashboard, "Context full" alone read as wrong.
        full = f"Context full ({n_ctx:,} tokens, {reply_room(max_tokens, n_ctx):,} of them kept for the reply)"
        oldest = "the oldest turn" if turns == 1 else f"the oldest {turns:,} turns"
        if none_left:  # nothing of the history is left to shift or prefill
            return (f"{full}: {oldest} left the model's "
                    "context; no earlier turn is left in it, only the persona and this message.")
        if shifted:
            how = f"shifted out of the cached state ({shifted:,} tokens): the rest is not prefilled again"
        else:
            how = ("the rest is prefilled once (too little of it was in the model's memory to shift)"
                   # A fresh context (a new model), or one whose rest after the cut
                   # would share too few tokens with the prompt to beat a prefill.
                   if self.overflow is Overflow.SHIFT
                   else f"the rest is prefilled once ({self.overflow.value}: {self.overflow_reason})")
        return f"{full}: {oldest} left the model's context, {how}."

    def _record_start(
        self,
        m: TurnMetrics,
        persona: Persona,
        pp: templates.PersonaPrefix,
        reuse: Reuse,
        prepared: PreparedPersona | None,
        prompt_tokens: int,
    ) -> AheadCredit | None:
        """What the turn starts from, in its metrics: the token counts, what was
        prefilled ahead of it (its credit, returned), the cache outcome and its detail."""
        m.prompt_tokens = prompt_tokens
        m.cached_tokens = reuse.tokens
        m.prefilled_tokens = prompt_tokens - reuse.tokens
        restored_ahead = self._ahead.restored
        credit = self._ahead.take(reuse.tokens if reuse.source == "live" else 0)
        if credit is not None:
            m.ahead_tokens, m.ahead_ms = credit.tokens, credit.ms
        started = started_from(reuse, restored_ahead)
        outcome = classify(started, prepared, persona.fingerprint, m.ahead_tokens)
        m.cache_outcome, m.restore_ms, m.restore_at_switch = (
            outcome.label, outcome.restore_ms, outcome.restore_at_switch)
        # A switch turn's context is the prefix prefilled for it: "reused ... (live
        # context)" would contradict its reused count of 0 in every report.
        share = (switch_label(started.tokens, prompt_tokens, m.ahead_tokens)
                 if outcome.label == CacheOutcome.SWITCH else started.label(prompt_tokens))
        details = [share, "" if pp.helps else pp.reason, *started.misses]
        m.cache_detail = "; ".join(d for d in details if d)
        return credit

    def _prefill_prompt(
        self,
        turn: Turn,
        persona: Persona,
        pp: templates.PersonaPrefix,
        tokens: list[int],
        use_cache: bool,
        t_prefill: float,
    ) -> bool:
        """Prefill what the context lacks of `tokens`, saving the persona prefix
        on the way when this turn is the one computing it; False when the turn
        was stopped during it, with the time the prefill ran and the tokens it
        did in the metrics."""
        llm = self.llm
        assert llm is not None
        m = turn.metrics
        todo = len(tokens) - llm.n_tokens
        prefix = pp.tokens
        prefilled = False
        try:
            if (use_cache and self.kv_cache is not None and self.kv_cache.write_error is None and pp.helps
                    and len(prefix) >= MIN_REUSE and llm.n_tokens < len(prefix) < len(tokens)
                    and tokens[: len(prefix)] == prefix):
                part = self._prefill(prefix[llm.n_tokens :], turn, 0, todo, t_prefill)
                if part.aborted:
                    return False
                self._keep(Slot.persona(persona.id), {"prefill_ms": part.ms})
                m.cache_detail += "; persona prefix saved for next time"
            rest = self._prefill(tokens[llm.n_tokens :], turn, todo - (len(tokens) - llm.n_tokens), todo, t_prefill)
            prefilled = not rest.aborted
        finally:
            if not prefilled:
                # Stopped between batches, or inside one by the abort flag (the
                # decode raises): what ran is kept.
                m.prefill_ms = (time.perf_counter() - t_prefill) * 1000.0
                m.prefilled_tokens = max(llm.n_tokens - m.cached_tokens, 0)
        return prefilled

    def _sample(self, turn: Turn, s: Sampling, tokens: list[int], t_prefill: float) -> Iterator[str]:
        """Stream the reply sampled after the prefilled `tokens` (from the last
        batch's logits), until end of generation, a cancel or the token limit;
        llama.cpp's perf counters for the turn go to `turn.perf`."""
        llm = self.llm
        assert llm is not None
        m = turn.metrics
        max_tokens = min(s.max_tokens, llm.n_ctx() - len(tokens))
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        if s.temperature > 0:
            # llama-cpp-python keeps one seed per Llama: without a fresh one
            # every regenerate of a prompt would sample the same reply.
            m.seed = s.seed if s.seed is not None else secrets.randbelow(2**31)
            llm.set_seed(m.seed)
        generator = llm.generate(
            tokens,
            top_k=s.top_k,
            top_p=s.top_p,
            min_p=s.min_p,
            temp=s.temperature,
            repeat_penalty=s.repeat_penalty,
            reset=True,
        )
        sampled: list[int] = []
        turn.keep_tokens(self.model_identity, sampled)
        try:
            for token in generator:
                turn.token_arrived()
                if m.generated_tokens == 1:
                    m.prefill_ms = (time.perf_counter() - t_prefill) * 1000.0
                if llama_cpp.llama_vocab_is_eog(self._vocab, token):
                    m.stop_reason = StopReason.EOS
                    break
                sampled.append(token)
                yield decoder.decode(self.token_bytes(token))
                if turn.cancelled:
                    m.stop_reason = StopReason.CANCELLED
                    break
                if m.generated_tokens >= max_tokens:
                    m.stop_reason = StopReason.LENGTH if max_tokens == s.max_tokens else StopReason.CONTEXT
                    break
                if m.generated_tokens % RECHECK_TOKENS == 0:
                    self._threads.apply()  # another process may have taken a core, or left one
            else:
                m.stop_reason = StopReason.EOS
        finally:
            generator.close()
            tail = decoder.decode(b"", final=True)
            if tail:
                turn.reply += tail
            turn.perf = _perf_counters(llm)

    def _close_early(self) -> None:
        early, self._early = self._early, None
        if early is not None:
            early.close()  # frees the early model if open_model did not take it

    def close(self) -> None:
        self._close_early()  # made, never loaded
        self.wait_for_saves()  # every kept state reaches the disk before exit
        with self._gate.lock:  # never free the model under a running turn
            if self.llm is not None:
                self._threads.close()
                self.llm.close()
                self.llm = None

