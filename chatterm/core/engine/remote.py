"""The remote engine: chat against an OpenAI-compatible streaming server.

Contract (in addition to `chatterm.core.engine.interface`):
- Works with any server speaking the chat-completions protocol with server-sent
  events: llama.cpp's server, llama-cpp-python's server, vLLM, SGLang,
  TensorRT-LLM's `trtllm-serve`. One `httpx.Client` per engine (keep-alive, so
  a turn does not pay a TCP handshake); the caller drives `Turn.stream()` from
  one worker thread.
- The API key is read from `os.environ[spec.api_key_env]` when a request is
  made and lives only in that request's headers: it is never stored on an
  object, and any text a server sends back is scrubbed of it before it reaches
  an error message, a log line or the store.
- TTFT is submit -> first delta that carries content. Every content delta counts
  as one token while streaming (servers send one token per event, near enough);
  the server's final `usage` (asked for with `stream_options.include_usage`)
  replaces the counts. Without usage, prompt tokens are estimated at 4
  characters per token and `metrics.tokens_estimated` is set.
- Prefix caching is the server's business: `cache_outcome` is SERVER and
  `cached_tokens` is what the server reports
  (`usage.prompt_tokens_details.cached_tokens`, or llama.cpp's `timings.cache_n`).
- Context trimming uses the same 4-characters-per-token estimate (we have no
  tokenizer for the served model) and the local engine's sticky cut
  (`context_window.choose_cut`): when the prompt plus the reply's room would
  not fit `spec.n_ctx`, the oldest turns are left out until half of it is free,
  and the cut stays where it is while the prompt fits again (remembered by the
  engine as `anchor_of` its first kept message), so consecutive requests share
  their prefix and a server's prefix cache keeps hitting.
- Cancel closes the HTTP stream, which is how every one of these servers learns
  to stop generating. `Turn.cancel()` from another thread also shuts the
  socket down once response headers have arrived, so a server that is silent
  (a long prefill) cannot hold the worker thread until its next event.
- Failures (connection, timeout, HTTP 4xx/5xx with the server's own reason,
  malformed events, a stream cut short) end the turn with
  `stop_reason == StopReason.ERROR` and a one-line `metrics.error`; the partial reply stays.
  After a failed turn the pooled connections are dropped: a server that failed
  mid-reply often closes the connection just after answering.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from typing import Any, Iterable, Iterator, Sequence
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from chatterm.core.config.catalog import ModelSpec, PriceProfile
from chatterm.core.config.personas import Persona
from chatterm.core.engine.context_window import KEEP_AFTER_CUT, anchor_index, anchor_of, choose_cut, turn_starts
from chatterm.core.engine.interface import (
    MIN_REPLY_TOKENS,
    ChatMessage,
    DeviceInfo,
    Engine,
    EngineCapabilities,
    Progress,
    Turn,
    context_full_notice,
    reply_room,
)
from chatterm.core.metrics.turn_metrics import CacheOutcome, StopReason, TurnMetrics
from chatterm.errors import ChattermError

CHARS_PER_TOKEN = 4
"""Token estimate for text we cannot tokenize (the served model's tokenizer is remote)."""
MESSAGE_OVERHEAD_TOKENS = 4
"""Chat-template tokens around each message (role markers, separators), estimated."""
LOAD_READ_TIMEOUT_S = 15.0
"""Longest wait for GET /models at load (a listing, not generation)."""
ERROR_BODY_MAX_BYTES = 65536
"""An error body is read up to this size (the reason is at its start)."""
REASON_MAX_CHARS = 160
"""Server reasons are cut to this length: the error must stay one readable line."""

_FINISH_TO_STOP = {"length": StopReason.LENGTH}
"""finish_reason -> stop_reason; "stop", "eos", "content_filter", "tool_calls" -> EOS."""


def estimate_tokens(text: str) -> int:
    """Tokens in `text` at 4 characters per token (rounded up)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def estimate_prompt_tokens(messages: Iterable[dict[str, str]]) -> int:
    return sum(estimate_tokens(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in messages)


def _message_tokens(message: ChatMessage) -> int:
    return estimate_tokens(message.content) + MESSAGE_OVERHEAD_TOKENS


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _one_line(text: object, limit: int = REASON_MAX_CHARS) -> str:
    """One printable line: whitespace collapsed, control characters (ANSI/OSC
    escapes from a hostile server) removed, cut to `limit`. Redact secrets
    *before* calling this, or a key cut in half survives the redaction."""
    line = " ".join(_CONTROL.sub(" ", str(text)).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _public_url(url: str) -> str:
    """The URL without user:password@ (credentials must not reach the store or export)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _url_auth(url: str) -> httpx.BasicAuth | None:
    """The user:password@ of `url` as HTTP basic auth (what httpx makes of it),
    so the client is given the URL without them."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return None
    return httpx.BasicAuth(unquote(parts.username or ""), unquote(parts.password or ""))


def _reason_from_body(body: bytes, key: str) -> str:
    """The server's own explanation from an error body, whichever shape it uses.

    OpenAI / vLLM / SGLang / llama.cpp: {"error": {"message": ...}};
    older vLLM: {"message": ...}; FastAPI (llama-cpp-python): {"detail": ...}.
    """
    text = _redact(body.decode("utf-8", "replace"), key)
    try:
        data = json.loads(text)
    except ValueError:
        return _one_line(text)
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return _one_line(err["message"])
        if isinstance(err, str) and err:
            return _one_line(err)
        if data.get("message"):
            return _one_line(data["message"])
        detail = data.get("detail")
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            detail = detail[0].get("msg", detail[0])
        if detail:
            return _one_line(detail)
    return _one_line(text)


def _sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The `data` of each server-sent event (multi-line data joined with newlines).

    Comments (": ping") and `event:`/`id:`/`retry:` fields are skipped. A non-standard
    `error: ...` line (some servers send it mid-stream) is passed on as an error object.
    """
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            data.append(value)
        elif field == "error":
            yield json.dumps({"error": {"message": value}})
    if data:
        yield "\n".join(data)


class RemoteEngine(Engine):
    kind = "openai"
    capabilities = EngineCapabilities()  # the server owns its KV state and prefix cache

    def __init__(self, spec: ModelSpec, price: PriceProfile):
        super().__init__(spec, price)
        self._client: httpx.Client | None = None
        self._notes: list[str] = []
        self._url = _public_url(spec.base_url)
        self._anchor = ""
        """`anchor_of` the first message the last prompt kept; "" when it kept the whole history."""

    def __repr__(self) -> str:
        return f"RemoteEngine({self.spec.id!r}, {self._url!r})"

    # -- connection --------------------------------------------------------
    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                base_url=self._url,  # httpx logs each request's URL (`-v`, launch.log)
                auth=_url_auth(self.spec.base_url),
                timeout=httpx.Timeout(
                    self.spec.read_timeout_s,
                    connect=self.spec.connect_timeout_s,
                ),
            )
        return self._client

    def _api_key(self) -> str:
        """The key from the environment, read now; "" when the entry names none."""
        name = self.spec.api_key_env
        if not name:
            return ""
        key = os.environ.get(name, "")
        if not key:
            raise ChattermError(
                f"model {self.spec.id!r}: environment variable {name} (api_key_env) is not set"
            )
        return key

    @staticmethod
    def _headers(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _transport_error(self, exc: Exception, key: str) -> str:
        if isinstance(exc, httpx.ConnectTimeout):
            what = f"connection timed out after {self.spec.connect_timeout_s:g} s"
        elif isinstance(exc, httpx.ReadTimeout):
            what = f"no data for {_read_timeout(exc, self.spec.read_timeout_s):g} s (read_timeout_s)"
        elif isinstance(exc, httpx.ConnectError):
            what = f"cannot connect ({_one_line(_redact(str(exc), key), 80) or type(exc).__name__})"
        elif isinstance(exc, httpx.RemoteProtocolError):
            what = f"connection broken ({_one_line(_redact(str(exc), key), 80)})"
        else:
            what = f"{type(exc).__name__}: {_one_line(_redact(str(exc), key), 80)}"
        return _redact(f"server {self._url}: {what}", key)

    # -- Engine ------------------------------------------------------------
    def load(self, progress: Progress | None = None) -> None:
        """Check the server answers (GET /models); servers without that route are fine."""
        key = self._api_key()
        if progress:
            progress(0.0)
        # /models needs no model work: a server that accepts the connection but says
        # nothing for LOAD_READ_TIMEOUT_S is reported rather than waited on.
        timeout = httpx.Timeout(
            min(self.spec.read_timeout_s, LOAD_READ_TIMEOUT_S), connect=self.spec.connect_timeout_s
        )
        try:
            resp = self.client.get("/models", headers=self._headers(key), timeout=timeout)
        except httpx.HTTPError as exc:
            raise ChattermError(self._transport_error(exc, key)) from None
        if resp.status_code in (401, 403):
            reason = _reason_from_body(resp.content, key)
            hint = (
                f" (key from {self.spec.api_key_env})"
                if self.spec.api_key_env
                else " (set api_key_env in models.toml)"
            )
            raise ChattermError(
                f"server {self._url} refused the API key{hint}: HTTP {resp.status_code} {reason}"
            )
        self._notes = []
        if resp.is_success:
            self._check_model_listed(resp)
        elif resp.status_code >= 500:
            self._notes.append(f"GET /models answered HTTP {resp.status_code}")
        if progress:
            progress(1.0)

    def _check_model_listed(self, resp: httpx.Response) -> None:
        try:
            ids = [m.get("id") for m in resp.json().get("data", []) if isinstance(m, dict)]
        except (ValueError, AttributeError):
            return
        if ids and self.spec.remote_model not in ids:
            shown = ", ".join(str(i) for i in ids[:3]) + (" ..." if len(ids) > 3 else "")
            self._notes.append(
                f"model {self.spec.remote_model!r} is not in the server's list ({_one_line(shown, 120)})"
            )

    def device(self) -> DeviceInfo:
        return DeviceInfo(
            backend="remote", name=self._url, n_ctx=self.spec.n_ctx, notes=list(self._notes)
        )

    @property
    def model_identity(self) -> str:
        return f"{self._url}#{self.spec.remote_model}"

    def start_turn(self, persona: Persona, history: Sequence[ChatMessage], user_text: str) -> Turn:
        metrics = TurnMetrics(
            engine=self.kind,
            model_id=self.spec.id,
            persona_id=persona.id,
            submitted_at=time.time(),
            price_profile=self.price.id,
            cache_outcome=CacheOutcome.SERVER,
        )
        exchange = _Exchange()
        turn = Turn(metrics, self.price, lambda t: self._generate(t, exchange))
        turn.on_cancel(exchange.wake)
        system = {"role": "system", "content": persona.system_prompt}
        user = {"role": "user", "content": user_text}
        sampling = persona.sampling
        n_ctx = self.spec.n_ctx
        room = reply_room(sampling.max_tokens, n_ctx)
        dropped, moved, first = self._cut(history, system, user_text, n_ctx - room)
        messages = [system, *({"role": m.role, "content": m.content} for m in history[first:]), user]
        metrics.dropped_turns, metrics.cut_turns = dropped, moved
        if moved:
            turn.notices.append(
                context_full_notice(n_ctx, moved, f", estimated at {CHARS_PER_TOKEN} characters per token")
            )
        metrics.prompt_tokens = estimate_prompt_tokens(messages)
        if metrics.prompt_tokens + MIN_REPLY_TOKENS > n_ctx:
            # Sent anyway: the estimate may be wrong, and the server's answer says
            # what really happened. This notice explains a rejection or a cut stream.
            exchange.prompt_may_overflow = True
            turn.notices.append(
                f"The prompt (~{metrics.prompt_tokens} tokens, estimated at {CHARS_PER_TOKEN} "
                f"characters per token) may not fit the {n_ctx}-token context of model "
                f"{self.spec.id!r} (n_ctx in models.toml)."
            )
        metrics.prefilled_tokens = metrics.prompt_tokens
        # Servers such as vLLM reject prompt + max_tokens > context outright; ask for
        # no more than what is left (by the estimate), and never less than the room
        # reserved above.
        max_tokens = min(sampling.max_tokens, max(n_ctx - metrics.prompt_tokens, room))
        turn.request = {
            "model": self.spec.remote_model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": max_tokens,
        }
        return turn

    # -- generation ----------------------------------------------------------
    def _cut(self, history: Sequence[ChatMessage], system: dict[str, str], user_text: str,
             budget: int) -> tuple[int, int]:
        """(turns the prompt leaves out, the index of its first history message):
        the last request's cut while the prompt fits `budget`, else where
        `choose_cut` moves it."""
        starts = turn_starts([m.role for m in history])
        bounds = [*starts, len(history)]
        at = anchor_index(history, starts, self._anchor)
        sizes = [sum(_message_tokens(m) for m in history[a:b])
                 for a, b in zip(bounds[at:], bounds[at + 1:], strict=False)]
        user = ChatMessage("user", user_text)
        cut = at + choose_cut(sizes, _message_tokens(user), estimate_prompt_tokens([system]), budget, KEEP_AFTER_CUT)
        # With every turn left out, the next prompt's history starts at this message.
        first = history[bounds[cut]] if cut < len(starts) else user
        self._anchor = anchor_of(first) if cut else ""
        return cut, cut - at, bounds[cut]

    def _generate(self, turn: Turn, exchange: "_Exchange") -> Iterator[str]:
        key = ""
        with self._lock:
            turn.engine_started()
            try:
                if turn.cancelled:
                    return
                key = self._api_key()
                yield from self._exchange(turn, exchange, key)
            except Exception as exc:  # noqa: BLE001 - redacted here, reported by Turn.stream
                if turn.cancelled:
                    return  # a cancel that broke the read is not an error
                # A server that failed mid-reply may close the connection right after
                # answering; reusing it from the pool would fail the next turn with
                # "connection reset". Start the next turn on a fresh connection.
                self.close()
                if isinstance(exc, ChattermError):
                    message = str(exc)
                elif isinstance(exc, httpx.HTTPError):
                    message = self._transport_error(exc, key)
                else:
                    message = f"{type(exc).__name__}: {_one_line(_redact(str(exc), key), 120)}"
                raise ChattermError(_redact(message, key)) from None
            finally:
                exchange.settle_counts(turn.metrics)

    def _exchange(self, turn: Turn, exchange: "_Exchange", key: str) -> Iterator[str]:
        with self.client.stream(
            "POST", "/chat/completions", json=turn.request, headers=self._headers(key)
        ) as resp:
            if resp.status_code >= 400:
                reason = _reason_from_body(_read_bounded(resp), key) or resp.reason_phrase
                raise ChattermError(f"server {self._url}: HTTP {resp.status_code} {reason}")
            ctype = resp.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                reason = _reason_from_body(_read_bounded(resp), key)
                raise ChattermError(
                    f"server {self._url} did not stream (content-type "
                    f"{_one_line(ctype, 60)!r}){': ' + reason if reason else ''}"
                )
            stream = resp.extensions.get("network_stream")
            exchange.attach(stream.get_extra_info("socket") if stream is not None else None)
            try:
                yield from self._events(turn, exchange, resp, key)
            finally:
                exchange.attach(None)
        # Leaving the `with` closes the response; an unfinished one closes the
        # connection, which is what tells the server to stop generating.

    def _events(self, turn: Turn, exchange: "_Exchange", resp: httpx.Response, key: str) -> Iterator[str]:
        finish: str | None = None
        done = False
        high = ""  # a delta's trailing high surrogate, waiting for its pair
        for data in _sse_data(resp.iter_lines()):
            if turn.cancelled:
                return
            if data.strip() == "[DONE]":
                done = True
                break
            try:
                event = json.loads(data)
                if not isinstance(event, dict):
                    raise ValueError("not an object")
            except ValueError:
                raise ChattermError(
                    f"malformed event from {self._url}: {_one_line(_redact(data, key), 80)!r}"
                ) from None
            if "error" in event or event.get("object") == "error":
                # {"error": {...}} (OpenAI shape) or {"object": "error", "message": ...}
                # (older vLLM): the server gave up mid-reply and said why.
                err = event.get("error") or event
                msg = err.get("message", err) if isinstance(err, dict) else err
                raise ChattermError(f"server {self._url}: {_one_line(_redact(str(msg), key))}")
            if isinstance(event.get("usage"), dict):
                exchange.usage = event["usage"]
            if isinstance(event.get("timings"), dict):
                exchange.timings = event["timings"]
            choices = event.get("choices")
            for choice in choices if isinstance(choices, list) else []:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta") or {}
                content = delta.get("content") if isinstance(delta, dict) else None
                if content:
                    turn.token_arrived()
                    text, high = _whole_characters(high + str(content))
                    if text:
                        yield text
                if choice.get("finish_reason"):
                    finish = str(choice["finish_reason"])
        if high:
            yield _LONE
        if turn.cancelled:
            return
        if finish is None and not done:
            # Servers that fail mid-stream (llama-cpp-python: prompt over its context)
            # just end the stream; the reason is only in the server's log.
            hint = (
                "; the prompt may exceed its context"
                if exchange.prompt_may_overflow
                else "; its log has the reason"
            )
            raise ChattermError(
                f"server {self._url} closed the stream before the reply finished{hint}"
            )
        turn.metrics.stop_reason = _FINISH_TO_STOP.get(finish or "", StopReason.EOS)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


_SURROGATE = re.compile("[\ud800-\udfff]")
_LONE = "\ufffd"


def _whole_characters(text: str) -> tuple[str, str]:
    """(the text to show, a trailing high surrogate kept for the next delta).
    JSON's `\\ud83d\\ude00` escapes may reach us as a pair split across two
    events, or a lone half: joined, or U+FFFD, since a lone surrogate can be
    neither written to the terminal nor stored as UTF-8."""
    if _SURROGATE.search(text) is None:
        return text, ""
    high = ""
    if "\ud800" <= text[-1] <= "\udbff":
        text, high = text[:-1], text[-1]
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace"), high


def _read_timeout(exc: Exception, default: float) -> float:
    """The read timeout the failed request ran under (load uses a shorter one)."""
    try:
        return float(exc.request.extensions["timeout"]["read"])  # type: ignore[attr-defined]
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError):
        return default


def _read_bounded(resp: httpx.Response) -> bytes:
    """The start of a response body (an error reason), never more than ERROR_BODY_MAX_BYTES."""
    body = b""
    for chunk in resp.iter_bytes():
        body += chunk
        if len(body) >= ERROR_BODY_MAX_BYTES:
            break
    return body[:ERROR_BODY_MAX_BYTES]


def _count(value: Any, kind: type = int) -> Any:
    """A count (or time) a server reported, or None when it is not a finite number >= 0
    (a hostile or buggy server may send "12", -7, 1e400 or NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not 0 <= value < 2**53:  # NaN fails too; beyond 2**53 is no real count (and overflows SQLite)
        return None
    return kind(value)


def _redact(text: str, key: str) -> str:
    return text.replace(key, "***") if key else text


class _Exchange:
    """One turn's streaming state: the socket to wake on cancel, what the server
    reported, and whether the prompt was expected to overflow."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._sock_lock = threading.Lock()
        self.prompt_may_overflow = False
        """The estimated prompt leaves no room for a reply in n_ctx."""
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None

    def attach(self, sock: socket.socket | None) -> None:
        with self._sock_lock:
            self._sock = sock

    def wake(self) -> None:
        """Wake a reader blocked on a silent server. shutdown() (unlike close())
        interrupts a recv() in another thread; the base-class method is used so
        that a TLS socket is not unwrapped under the reader's feet."""
        with self._sock_lock:
            if self._sock is not None:
                try:
                    socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
                except OSError:
                    pass

    def settle_counts(self, m: TurnMetrics) -> None:
        """Replace the streaming estimates with the server's usage, when it sent any."""
        usage = self.usage
        if usage:
            m.prompt_tokens = _count(usage.get("prompt_tokens")) or m.prompt_tokens
            m.generated_tokens = _count(usage.get("completion_tokens")) or m.generated_tokens
            details = usage.get("prompt_tokens_details") or {}
            cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
            if cached is None and self.timings:
                cached = _count(self.timings.get("cache_n"))
            m.cached_tokens = cached or 0
            m.tokens_estimated = False
            m.cache_detail = (
                f"server reported {m.cached_tokens} cached prompt tokens"
                if cached is not None
                else "server reports no cached-token count"
            )
        else:
            m.tokens_estimated = True
            m.cache_detail = "server sent no usage: counts estimated"
        m.cached_tokens = min(m.cached_tokens, m.prompt_tokens)
        m.prefilled_tokens = m.prompt_tokens - m.cached_tokens
        prompt_ms = _count(self.timings.get("prompt_ms"), float) if self.timings else None
        if prompt_ms is not None:
            # llama.cpp's server times its own prefill; other servers do not say.
            m.prefill_ms = prompt_ms
