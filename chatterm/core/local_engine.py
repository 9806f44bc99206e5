"""The local engine: llama.cpp in process, with persona KV state on disk.

Contract (beyond chatterm.core.engine):
- `load()` loads the model once with llama.cpp's progress callback, routes
  llama.cpp's log into Python logging, hashes the model file (cached) and
  warms the context up so the first turn's TTFT carries no one-time cost.
- A turn makes the persona's system prefix ready first: already in the context
  ("memory"), restored from its state file ("restored"), or prefilled and then
  saved in the background ("cold"). The full prompt is the model's own chat
  template over [system, history..., user]; llama-cpp-python's prefix matching
  then prefills only the tokens after the longest common prefix.
- The prefix is the system message rendered with add_generation_prompt=False
  and tokenized like the chat handler (add_bos=False, special=True). When a
  template does not make it an exact token prefix of the full prompt, the turn
  falls back to a plain prefill and says why in `cache_detail`.
- Metrics are exact: TTFT from submit to the first sampled token; decode
  tokens/s from first to last token; llama.cpp's own perf counters for the
  turn are kept in `Turn.perf` (tests compare the two).
- When the prompt would not fit n_ctx (leaving room for the reply), the oldest
  history turns are dropped (never the persona) and the turn says how many;
  a single message that alone cannot fit keeps its last tokens, and says so.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import hashlib
import logging
import platform
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Sequence

import llama_cpp
from llama_cpp import llama_chat_format

from chatterm.core import llama_log, offload
from chatterm.core.engine import (
    ChatMessage,
    DeviceInfo,
    Engine,
    EngineCapabilities,
    PrefixReport,
    Progress,
    Turn,
    context_full_notice,
    reply_room,
    trim_history,
)
from chatterm.core.errors import ChattermError
from chatterm.core.file_identity import sha256_of_file
from chatterm.core.kv_cache import KVStateCache, LoadedState
from chatterm.core.metrics import CacheOutcome, StopReason, TurnMetrics
from chatterm.core.models import ModelSpec, PriceProfile
from chatterm.core.personas import Persona

log = logging.getLogger(__name__)

# llama-cpp-python reads llama_model_default_params() inside Llama.__init__ and
# offers no way to pass a progress callback; we swap the function for the
# duration of one load, under this lock.
_params_patch_lock = threading.Lock()


@contextlib.contextmanager
def _load_progress(progress: Progress | None):
    if progress is None:
        yield
        return

    @llama_cpp.llama_progress_callback
    def on_progress(value: float, _user_data) -> bool:
        try:
            # False from the caller (the app is quitting) makes llama.cpp stop loading.
            return progress(min(max(float(value), 0.0), 1.0) * 0.9) is not False
        except Exception:  # noqa: BLE001 - never raise into C
            return True

    original = llama_cpp.llama_cpp.llama_model_default_params

    def with_callback():
        params = original()
        params.progress_callback = on_progress
        return params

    with _params_patch_lock:
        llama_cpp.llama_cpp.llama_model_default_params = with_callback
        try:
            yield
        finally:
            llama_cpp.llama_cpp.llama_model_default_params = original


def _check_gguf(path: Path) -> None:
    if not path.exists():
        raise ChattermError(f"{path}: model file not found")
    if not path.is_file():
        raise ChattermError(f"{path}: not a file")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ChattermError(f"{path}: cannot read model file: {exc.strerror}") from None
    if magic != b"GGUF":
        raise ChattermError(f"{path}: not a GGUF model file (bad magic {magic!r})")


def _llama_library_sha256() -> str:
    """Identity of the llama.cpp build: restore silently accepts a different
    llama.cpp version (docs/engine.md), so the library's own bytes are part of `compat`."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libllama.so", "libllama.dylib", "llama.dll"):
        if (lib_dir / name).exists():
            return sha256_of_file(lib_dir / name)
    return "unknown"


class LocalEngine(Engine):
    kind = "local"
    capabilities = EngineCapabilities(persona_cache=True, kv_control=True)

    def __init__(self, spec: ModelSpec, price: PriceProfile, kv_cache: KVStateCache | None = None):
        super().__init__(spec, price)
        self.kv_cache = kv_cache
        self.llm: llama_cpp.Llama | None = None
        self.plan: offload.OffloadPlan | None = None
        self.load_notes: list[str] = []
        self._model_sha256 = ""
        self._compat_base: dict[str, Any] = {}
        self._prefix_cache: dict[str, list[int]] = {}
        self._switch_report: tuple[str, PrefixReport] | None = None
        """(persona fingerprint, report) of a prefix made ready by prepare_persona
        and not yet used by a turn; cleared whenever the context is cleared."""
        self._running: Turn | None = None
        self._abort_flag = ctypes.create_string_buffer(2)
        self._cache_warned = False
        self._savers: list[threading.Thread] = []
        self._prefill_ms_per_token: dict[str, float] = {}

    # -- loading ---------------------------------------------------------
    def load(self, progress: Progress | None = None) -> None:
        path = self.spec.model_path()
        _check_gguf(path)
        llama_log.install()
        plan = offload.plan_offload(self.spec, llama_cpp.llama_supports_gpu_offload())

        def try_load(n_gpu_layers: int, flash_attn: bool) -> llama_cpp.Llama:
            with _load_progress(progress):
                return llama_cpp.Llama(
                    str(path),
                    n_ctx=self.spec.n_ctx,
                    n_gpu_layers=n_gpu_layers,
                    flash_attn=flash_attn,
                    type_k=plan.type_k,
                    type_v=plan.type_v,
                    n_threads=self.spec.n_threads,
                    verbose=False,
                )

        with llama_log.capture_errors() as errors:
            try:
                self.llm, self.plan, notes = offload.load_with_fallback(
                    plan, try_load, offload.gguf_block_count(path)
                )
            except (ValueError, RuntimeError, MemoryError) as exc:
                # llama.cpp's first error is the specific one ("tensor ... not
                # within the file bounds"); later ones just say the load failed.
                reason = errors[0].strip() if errors else str(exc)
                raise ChattermError(f"{path}: llama.cpp could not load the model: {reason}") from None
        self.load_notes = list(notes)
        self._model_sha256 = sha256_of_file(path)
        self._compat_base = self._compat_fields(path)
        self._formatters()
        self._install_abort_flag()
        self._warm_up()
        if progress is not None:
            progress(1.0)

    def _compat_fields(self, path: Path) -> dict[str, Any]:
        llm = self.llm
        assert llm is not None and self.plan is not None
        meta = llm.metadata
        arch = meta.get("general.architecture", "")
        cp = llm.context_params
        return {
            "model_sha256": self._model_sha256,
            "model_size": path.stat().st_size,
            "llama_cpp_python": metadata.version("llama-cpp-python"),
            "llama_cpp_build": _llama_library_sha256(),
            "architecture": arch,
            "n_layer": llama_cpp.llama_model_n_layer(llm.model),
            "n_ctx": llm.n_ctx(),
            "type_k": int(cp.type_k),
            "type_v": int(cp.type_v),
            "flash_attn": bool(self.plan.flash_attn),
            "rope": {
                "freq_base": meta.get(f"{arch}.rope.freq_base"),
                "freq_scale_train": llama_cpp.llama_model_rope_freq_scale_train(llm.model),
                "scaling_type": meta.get(f"{arch}.rope.scaling.type"),
                "ctx_freq_base": cp.rope_freq_base,
                "ctx_freq_scale": cp.rope_freq_scale,
                "yarn": [cp.yarn_ext_factor, cp.yarn_attn_factor, cp.yarn_beta_fast,
                         cp.yarn_beta_slow, cp.yarn_orig_ctx],
            },
            "template_sha256": _sha256_text(self._template()),
            "lora": None,
        }

    def _template(self) -> str:
        assert self.llm is not None
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ChattermError(
                f"{self.spec.model_path()}: the model has no chat template (tokenizer.chat_template)"
            )
        return template

    def _formatters(self) -> None:
        llm = self.llm
        assert llm is not None
        eos = llm._model.token_get_text(llm.token_eos()) if llm.token_eos() != -1 else ""
        bos = llm._model.token_get_text(llm.token_bos()) if llm.token_bos() != -1 else ""
        template = self._template()
        self._prefix_format = llama_chat_format.Jinja2ChatFormatter(
            template, eos_token=eos, bos_token=bos, add_generation_prompt=False
        )
        self._prompt_format = llama_chat_format.Jinja2ChatFormatter(
            template, eos_token=eos, bos_token=bos, add_generation_prompt=True
        )
        self._vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self._piece = ctypes.create_string_buffer(64)

    def _install_abort_flag(self) -> None:
        """Let a cancel interrupt a long prefill (CPU backend only).

        llama.cpp calls the abort callback from its compute thread before every
        graph node. A Python callback would take the GIL ~1,000 times per decode,
        and wait up to the 5 ms switch interval each time the UI thread holds it.
        So the callback is libc's `strlen`, pointed at a two-byte buffer: it
        returns 1 (true) once byte 0 is set, 0 otherwise, with no Python involved.
        """
        self._abort_flag = ctypes.create_string_buffer(2)
        try:
            strlen = ctypes.CDLL(None).strlen
        except (OSError, AttributeError):  # no libc symbols (e.g. Windows): cancel waits for the prefill
            self._abort_callback = None
            return
        self._abort_callback = llama_cpp.ggml_abort_callback(ctypes.cast(strlen, ctypes.c_void_p).value)
        llama_cpp.llama_set_abort_callback(
            self.llm.ctx, self._abort_callback, ctypes.cast(self._abort_flag, ctypes.c_void_p)
        )

    def _set_abort(self, on: bool) -> None:
        self._abort_flag[0] = b"\x01" if on else b"\x00"

    def _warm_up(self) -> None:
        """Decode a short batch and a single token, then forget them: the first
        decode of a fresh context carries a one-time cost (docs/engine.md)."""
        llm = self.llm
        assert llm is not None
        tokens = llm.tokenize(b"Hello, warm up.", add_bos=False, special=False)[:8] or [0]
        llm.eval(tokens)
        llm.eval(tokens[:1])
        # llama.cpp books decode time into its perf counters only at the next
        # synchronize; without this the warm-up would be charged to turn one.
        llama_cpp.llama_synchronize(llm.ctx)
        self._clear_context()

    def _clear_context(self) -> None:
        llm = self.llm
        assert llm is not None
        self._switch_report = None
        llm.reset()
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)

    # -- information -----------------------------------------------------
    @property
    def model_identity(self) -> str:
        return self._model_sha256 or self.spec.id

    def device(self) -> DeviceInfo:
        plan = self.plan
        llm = self.llm
        n_layer = llama_cpp.llama_model_n_layer(llm.model) if llm is not None else None
        offloaded = (plan.layers_offloaded(n_layer) if plan is not None else 0) or 0
        on_gpu = offloaded > 0
        return DeviceInfo(
            backend="GPU" if on_gpu else "CPU",
            name=_gpu_name() if on_gpu else _cpu_name(),
            n_layers=n_layer,
            layers_offloaded=offloaded,
            kv_type=self.spec.kv_type,
            flash_attn=plan.flash_attn if plan else None,
            n_ctx=llm.n_ctx() if llm is not None else self.spec.n_ctx,
            notes=list(self.load_notes),
        )

    def context_used(self) -> int:
        return self.llm.n_tokens if self.llm is not None else 0

    def persona_cached(self, persona: Persona) -> bool:
        return self.kv_cache is not None and self.kv_cache.exists(self.spec.id, persona.id)

    # -- tokens ----------------------------------------------------------
    def _tokenize_prompt(self, text: str) -> list[int]:
        assert self.llm is not None
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def token_bytes(self, token: int) -> bytes:
        """The token's text bytes (control tokens give b"").

        llama-cpp-python's `token_to_piece` returns its whole 32-byte buffer,
        NUL padding included, so we call llama.cpp with the returned length."""
        n = llama_cpp.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, False)
        if n < 0:  # buffer too small: -n is the size needed
            self._piece = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, False)
        return self._piece.raw[:n]

    def prefix_tokens(self, persona: Persona) -> list[int]:
        key = persona.fingerprint
        if key not in self._prefix_cache:
            rendered = self._prefix_format(messages=[{"role": "system", "content": persona.system_prompt}])
            self._prefix_cache[key] = self._tokenize_prompt(rendered.prompt)
        return self._prefix_cache[key]

    def _compat(self, persona: Persona, prefix: list[int]) -> dict[str, Any]:
        return {
            **self._compat_base,
            "persona_sha256": persona.fingerprint,
            "prefix_tokens": prefix,
        }

    def _prompt_tokens(self, persona: Persona, history: Sequence[ChatMessage], user_text: str) -> list[int]:
        messages = [{"role": "system", "content": persona.system_prompt}]
        messages += [{"role": m.role, "content": m.content} for m in history]
        messages.append({"role": "user", "content": user_text})
        return self._tokenize_prompt(self._prompt_format(messages=messages).prompt)

    def fit_prompt(
        self, persona: Persona, history: Sequence[ChatMessage], user_text: str, max_tokens: int
    ) -> tuple[list[int], int, list[str]]:
        """Prompt tokens that fit n_ctx with room for the reply; (tokens, dropped turns, notices)."""
        assert self.llm is not None
        n_ctx = self.llm.n_ctx()
        room = reply_room(max_tokens, n_ctx)
        tokens, dropped = trim_history(
            history,
            lambda kept: self._prompt_tokens(persona, kept, user_text),
            len,
            n_ctx - room,
        )
        notices = [context_full_notice(n_ctx, dropped)] if dropped else []
        if len(tokens) + room > n_ctx:
            # No history left to drop: the message alone is too long. Keep its end
            # (a pasted document usually ends with the question about it).
            prefix_len = len(self.prefix_tokens(persona))
            message = self.llm.tokenize(user_text.encode("utf-8"), add_bos=False, special=False)
            keep = len(message) - (len(tokens) + room - n_ctx) - 8  # template may shift a few
            if keep <= 0:
                raise ChattermError(
                    f"the persona prompt ({prefix_len} tokens) leaves no room in the "
                    f"{n_ctx}-token context of model {self.spec.id!r}"
                )
            clipped = self.llm.detokenize(message[-keep:]).decode("utf-8", "ignore")
            tokens = self._prompt_tokens(persona, [], clipped)
            notices.append(
                f"Message too long ({len(message):,} tokens): kept its last {keep:,} tokens "
                f"to fit the {n_ctx:,}-token context."
            )
        return tokens, dropped, notices

    # -- persona prefix ----------------------------------------------------
    def _prefix_in_context(self, prefix: list[int]) -> bool:
        llm = self.llm
        assert llm is not None
        n = len(prefix)
        return llm.n_tokens >= n and llm.input_ids[:n].tolist() == prefix

    def _ensure_prefix(self, persona: Persona, prefix: list[int], use_cache: bool = True) -> PrefixReport:
        """Make `prefix` the start of the context: memory, restore, or prefill+save
        (`use_cache=False`: neither restore nor save)."""
        if self._prefix_in_context(prefix):
            return PrefixReport(CacheOutcome.MEMORY, 0.0, len(prefix))
        detail = ""
        cache = self.kv_cache if use_cache else None
        if cache is not None:
            t0 = time.perf_counter()
            loaded = cache.load(self.spec.id, persona.id, self._compat(persona, prefix))
            if isinstance(loaded, LoadedState):
                reason = self._restore(loaded, prefix)
                if reason is None:
                    self._note_prefill_rate(persona, float(loaded.header.get("prefill_ms", 0.0)), len(prefix))
                    return PrefixReport(CacheOutcome.RESTORED, (time.perf_counter() - t0) * 1000.0, len(prefix))
                detail = reason
            else:
                detail = loaded.reason
        t0 = time.perf_counter()
        self._clear_context()
        self.llm.eval(prefix)
        prefill_ms = (time.perf_counter() - t0) * 1000.0
        self._note_prefill_rate(persona, prefill_ms, len(prefix))
        if cache is not None and cache.write_error is None:
            self._save_prefix(persona, prefix, prefill_ms)
            detail = f"{detail}; state saved for next time" if detail else "state saved for next time"
        return PrefixReport(CacheOutcome.COLD, prefill_ms, len(prefix), detail)

    def _note_prefill_rate(self, persona: Persona, prefill_ms: float, tokens: int) -> None:
        """Keep the fastest cold prefill rate seen for the persona: a prefill that
        ran on a busy machine must not inflate the "saved" estimates."""
        if prefill_ms <= 0 or tokens <= 0:
            return
        rate = prefill_ms / tokens
        known = self._prefill_ms_per_token.get(persona.fingerprint)
        self._prefill_ms_per_token[persona.fingerprint] = rate if known is None else min(known, rate)

    def _restore(self, loaded: LoadedState, prefix: list[int]) -> str | None:
        """Load a checked state into the context; None on success, else the reason."""
        llm = self.llm
        assert llm is not None
        self._clear_context()
        # Verify the payload's chunk digests on the other core(s) while llama.cpp
        # copies it in (both release the GIL); a mismatch discards the state.
        verdict: list[bool] = []
        checker = threading.Thread(target=lambda: verdict.append(loaded.verify()), daemon=True)
        checker.start()
        size = loaded.payload.nbytes
        buffer = (ctypes.c_uint8 * size).from_buffer(loaded.payload)
        # The sequence API, not llama_state_set_data: the latter first clears the
        # whole n_ctx-sized KV buffer (~190 MB memset for 8k context on SmolLM2).
        used = llama_cpp.llama_state_seq_set_data(llm.ctx, buffer, size, 0)
        checker.join()
        del buffer
        loaded.close()
        if used == 0 or not verdict or not verdict[0]:
            # llama.cpp may have loaded some cells; our bookkeeping must match an empty cache.
            self._clear_context()
            return (
                "state file rejected: payload checksum mismatch"
                if verdict and not verdict[0]
                else "state file rejected by llama.cpp"
            )
        n = len(prefix)
        llm.input_ids[:n] = prefix
        llm.n_tokens = n
        llm._requires_eval = True  # the blob holds no logits
        return None

    def _save_prefix(self, persona: Persona, prefix: list[int], prefill_ms: float) -> None:
        assert self.kv_cache is not None
        llm = self.llm
        assert llm is not None
        size = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(llm.ctx, buffer, size, 0)
        payload = memoryview(buffer)[:written]
        info = {
            "n_prefix_tokens": len(prefix),
            "prefill_ms": prefill_ms,
            "state_size": llama_cpp.llama_state_get_size(llm.ctx),
            "seq_state_size": size,
        }
        compat = self._compat(persona, prefix)
        # The copy above took a few ms; writing and fsync-ing tens of MB must not
        # delay the first token, so it happens in the background.
        thread = threading.Thread(
            target=self.kv_cache.save,
            args=(self.spec.id, persona.id, compat, info, payload),
            name=f"kv-save-{persona.id}",
            daemon=True,
        )
        thread.start()
        self._savers = [t for t in self._savers if t.is_alive()] + [thread]

    def wait_for_saves(self) -> None:
        """Block until background state-file writes are done (CLI exit, tests)."""
        for thread in self._savers:
            thread.join()
        self._savers = []

    def interrupt(self) -> None:
        if self._running is not None:
            self._running.cancel()
        self._set_abort(True)

    def prepare_persona(self, persona: Persona) -> PrefixReport:
        with self._lock:
            self._set_abort(False)
            try:
                report = self._ensure_prefix(persona, self.prefix_tokens(persona))
            except RuntimeError:
                if self._abort_flag[0] != b"\x01":
                    raise
                raise ChattermError(f"preparing persona {persona.id!r} was interrupted") from None
            finally:
                self._set_abort(False)
            self._switch_report = (persona.fingerprint, report)
            return report

    def cache_notice(self) -> str | None:
        """One notice, once, when state files cannot be written."""
        if self.kv_cache is not None and self.kv_cache.write_error and not self._cache_warned:
            self._cache_warned = True
            return f"Persona cache off: {self.kv_cache.write_error}. Chat continues without it."
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
        turn.on_cancel(lambda: self._abort_if_running(turn))
        return turn

    def _abort_if_running(self, turn: Turn) -> None:
        if self._running is turn:
            self._set_abort(True)  # interrupts a prefill in progress

    def reset_context(self, keep: Persona | None = None) -> None:
        """Forget the context; with `keep`, keep that persona's prefix when it is
        there (a new conversation with the same persona). Waits for a running turn."""
        with self._lock:
            assert self.llm is not None
            prefix = self.prefix_tokens(keep) if keep is not None else None
            if prefix is not None and self._prefix_in_context(prefix):
                self._switch_report = None
                self.llm.n_tokens = len(prefix)
            else:
                self._clear_context()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[llama_cpp.Llama]:
        """The underlying `llama_cpp.Llama`, alone, for measuring the bare library
        against chatterm on the same loaded model; the context is cleared after."""
        with self._lock:
            assert self.llm is not None
            self._clear_context()
            try:
                yield self.llm
            finally:
                self._clear_context()

    def _generate(
        self, turn: Turn, persona: Persona, history: list[ChatMessage], user_text: str, use_cache: bool
    ) -> Iterator[str]:
        with self._lock:
            if self.llm is None:
                raise ChattermError("the model is not loaded")
            self._set_abort(False)
            self._running = turn
            try:
                if not turn.cancelled:
                    yield from self._run_turn(turn, persona, history, user_text, use_cache)
            except RuntimeError:
                if not turn.cancelled:
                    raise
                # llama_decode returned 2: the prefill was aborted by cancel().
            finally:
                self._running = None
                self._set_abort(False)
            if turn.cancelled and not turn.metrics.stop_reason:
                turn.metrics.stop_reason = StopReason.CANCELLED

    def _prefix_for_turn(self, persona: Persona, prefix: list[int], use_cache: bool) -> PrefixReport:
        """Make the persona prefix ready and say how, crediting a switch-time preparation."""
        switch, self._switch_report = self._switch_report, None
        report = self._ensure_prefix(persona, prefix, use_cache)
        if switch is None or switch[0] != persona.fingerprint or report.outcome != CacheOutcome.MEMORY:
            return report
        # Made ready when the persona was switched to: report how, not "memory".
        prepared = switch[1]
        if prepared.outcome == CacheOutcome.COLD:
            return PrefixReport(CacheOutcome.SWITCH, prepared.ms, prepared.tokens, prepared.detail)
        return prepared

    def _run_turn(
        self, turn: Turn, persona: Persona, history: list[ChatMessage], user_text: str, use_cache: bool
    ) -> Iterator[str]:
        llm = self.llm
        assert llm is not None
        m = turn.metrics
        s = persona.sampling
        llama_cpp.llama_synchronize(llm.ctx)
        llama_cpp.llama_perf_context_reset(llm.ctx)
        prefix = self.prefix_tokens(persona)
        report = self._prefix_for_turn(persona, prefix, use_cache)
        m.cache_outcome = report.outcome
        m.cache_detail = report.detail
        if report.outcome == CacheOutcome.RESTORED:
            m.restore_ms = report.ms
        notice = self.cache_notice()
        if notice:
            turn.notices.append(notice)

        tokens, m.dropped_turns, notices = self.fit_prompt(persona, history, user_text, s.max_tokens)
        turn.notices.extend(notices)
        if tokens[: len(prefix)] != prefix:
            m.cache_detail = "chat template does not start with the persona prefix: full prefill"
        max_tokens = min(s.max_tokens, llm.n_ctx() - len(tokens))
        common = _common_prefix(llm.input_ids[: llm.n_tokens].tolist(), tokens)
        m.prompt_tokens = len(tokens)
        m.cached_tokens = min(common, len(tokens) - 1)
        m.prefilled_tokens = len(tokens) - m.cached_tokens
        # Saved = cached tokens at this persona's measured cold prefill rate, net of
        # the restore; a cold prefix was paid for (now or at switch time).
        rate = self._prefill_ms_per_token.get(persona.fingerprint)
        if rate and report.outcome in (CacheOutcome.RESTORED, CacheOutcome.MEMORY):
            m.saved_prefill_ms = max(m.cached_tokens * rate - (m.restore_ms or 0.0), 0.0)

        if report.outcome == CacheOutcome.COLD:
            # The prefix was prefilled by this turn, not reused.
            m.cached_tokens = max(m.cached_tokens - len(prefix), 0)
            m.prefilled_tokens = len(tokens) - m.cached_tokens
            prefix_prefill_ms = report.ms
        else:
            prefix_prefill_ms = 0.0

        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        if s.temperature > 0:
            llm.set_seed(s.seed)
        t_prefill = time.perf_counter()
        generator = llm.generate(
            tokens,
            top_k=s.top_k,
            top_p=s.top_p,
            min_p=s.min_p,
            temp=s.temperature,
            repeat_penalty=s.repeat_penalty,
            reset=True,
        )
        try:
            for token in generator:
                turn.token_arrived()
                if m.generated_tokens == 1:
                    m.prefill_ms = prefix_prefill_ms + (time.perf_counter() - t_prefill) * 1000.0
                if llama_cpp.llama_vocab_is_eog(self._vocab, token):
                    m.stop_reason = StopReason.EOS
                    break
                yield decoder.decode(self.token_bytes(token))
                if turn.cancelled:
                    m.stop_reason = StopReason.CANCELLED
                    break
                if m.generated_tokens >= max_tokens:
                    m.stop_reason = StopReason.LENGTH
                    break
            else:
                m.stop_reason = StopReason.EOS
        finally:
            generator.close()
            tail = decoder.decode(b"", final=True)
            if tail:
                turn.reply += tail
            perf = llama_cpp.llama_perf_context(llm.ctx)
            turn.perf = {
                "t_p_eval_ms": perf.t_p_eval_ms,
                "n_p_eval": perf.n_p_eval,
                "t_eval_ms": perf.t_eval_ms,
                "n_eval": perf.n_eval,
            }

    def close(self) -> None:
        self.wait_for_saves()
        with self._lock:  # never free the model under a running turn
            if self.llm is not None:
                self.llm.close()
                self.llm = None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _gpu_name() -> str:
    from chatterm.core.gpu_telemetry import gpu_status

    status = gpu_status()
    return status.name if status is not None else "GPU (llama.cpp offload)"


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
