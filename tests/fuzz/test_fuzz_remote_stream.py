"""Fuzzing the served-model stream: whatever a server sends, a turn ends cleanly.

A scripted HTTP server on 127.0.0.1 answers each chat request with generated
bytes: server-sent events split at random points (even inside a UTF-8
character or a line ending), lines without `data:`, invalid JSON, huge deltas,
`[DONE]` early or never, stray `error:` lines, usage blocks with wrong types
and negative counts, error statuses and wrong content types; the stream then
ends, or the server falls silent. Through a real `RemoteEngine` and a
`Conversation`, every case gives:
- `Turn.stream()` never raises, and ends within the read timeout plus slack;
- exactly one turn recorded, whose reply is what was streamed;
- consistent metrics: a stop reason, a one-line error exactly when it failed,
  no negative or non-finite count, time or cost, cached <= prompt tokens.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from chatterm.core.config.catalog import ModelSpec, PriceProfile
from chatterm.core.config.personas import Persona, Sampling
from chatterm.core.engine.conversation import Conversation
from chatterm.core.engine.remote import RemoteEngine

READ_TIMEOUT_S = 0.3
PRICE = PriceProfile(id="fuzz-price", label="Fuzz", input_per_m=2.0, cached_input_per_m=0.5,
                     output_per_m=8.0, as_of="2025-01-01")
PERSONA = Persona(id="fuzz", name="Fuzz", system_prompt="You are terse.", sampling=Sampling(max_tokens=32))


class ScriptedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.reply: tuple[int, str, list[bytes], bool] = (200, "text/event-stream", [], False)
        self.release = threading.Event()
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"

    def handle_error(self, request, client_address):
        pass  # the client hanging up mid-stream is part of the game


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, ctype, chunks, silent_end = self.server.reply
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Connection", "close")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(chunk)
            self.wfile.flush()
        if silent_end:  # never [DONE], never closed: the client's read timeout must end it
            self.server.release.wait(READ_TIMEOUT_S * 4)


@pytest.fixture(scope="module")
def server():
    srv = ScriptedServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()
    thread.join(5)


@pytest.fixture(scope="module")
def engine(server):
    spec = ModelSpec(id="fuzz-remote", label="fuzz", kind="openai", price_profile=PRICE.id, n_ctx=2048,
                     base_url=server.url, remote_model="m", connect_timeout_s=2.0, read_timeout_s=READ_TIMEOUT_S)
    eng = RemoteEngine(spec, PRICE)
    yield eng
    eng.close()


# -- generated streams ---------------------------------------------------------
TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from("\x1b[31m\u202e\r\n\x00[b]x[/b]"), max_size=20)
NUMBERS = st.integers(-5, 10**6) | st.sampled_from(
    [-1, 2**70, 1.5, -0.5, math.inf, math.nan, "12", "x", None, True, [], {}]
)
JSON_ANY = st.recursive(st.none() | st.booleans() | NUMBERS | TEXT,
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                        max_leaves=6)


def chunk(content=None, finish=None, choices=None):
    delta = {} if content is None else {"content": content}
    return {"object": "chat.completion.chunk",
            "choices": choices if choices is not None else [{"index": 0, "delta": delta, "finish_reason": finish}]}


def data(obj) -> str:
    return "data: " + (obj if isinstance(obj, str) else json.dumps(obj, allow_nan=True)) + "\n\n"


usage = st.fixed_dictionaries({}, optional={
    "prompt_tokens": NUMBERS, "completion_tokens": NUMBERS,
    "prompt_tokens_details": st.fixed_dictionaries({}, optional={"cached_tokens": NUMBERS}) | JSON_ANY,
})
events = st.one_of(
    TEXT.map(lambda t: data(chunk(t))),
    st.sampled_from([10_000, 300_000]).map(lambda n: data(chunk("y" * n))),  # huge deltas
    st.sampled_from(["stop", "length", "eos", "content_filter", ""]).map(lambda f: data(chunk(finish=f))),
    st.just(data("[DONE]")),
    usage.map(lambda u: data({"choices": [], "usage": u})),
    st.fixed_dictionaries({"cache_n": NUMBERS, "prompt_ms": NUMBERS}).map(
        lambda t: data({"choices": [], "timings": t})
    ),
    JSON_ANY.map(lambda c: data(chunk(choices=c))),  # choices of any shape
    JSON_ANY.map(lambda d: data({"choices": [{"delta": d}]})),
    JSON_ANY.map(data),  # any JSON at all
    TEXT.map(lambda t: f"data: {{not json {t}\n\n"),
    TEXT.map(lambda t: f"{t}\n"),  # a line without a field name
    TEXT.map(lambda t: f"error: {t}\n\n"),  # stray error line
    JSON_ANY.map(lambda e: data({"error": e})),
    st.just(": ping\n\n"), st.just("event: message\nid: 7\nretry: 10\n"), st.just("\n\n\n"),
    TEXT.map(lambda t: f"data: {json.dumps(chunk(t))[:-3]}\ndata: {json.dumps(chunk(t))[-3:]}\n\n"),  # multi-line data
)


@st.composite
def replies(draw):
    body = "".join(draw(st.lists(events, max_size=12)))
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    raw = body.replace("\n", newline).encode("utf-8")
    cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    status = draw(st.sampled_from([200] * 8 + [400, 429, 500, 503]))
    types = ["text/event-stream"] * 6 + ["text/event-stream; charset=utf-8", "application/json", ""]
    ctype = draw(st.sampled_from(types))
    silent_end = draw(st.integers(0, 9)) == 0
    return status, ctype, chunks, silent_end


# -- the property ----------------------------------------------------------------
def check_turn(engine, reply_script, server) -> None:
    server.reply = reply_script
    conversation = Conversation(engine, PERSONA)
    finished = []
    t0 = time.monotonic()
    turn = conversation.send("Hello")
    turn.on_finished(finished.append)
    deltas = list(turn.stream())  # must not raise
    elapsed = time.monotonic() - t0
    assert elapsed < READ_TIMEOUT_S * 2 + 5, elapsed
    assert finished == [turn] and turn.done and len(conversation.turns) == 1
    assert turn.reply == "".join(deltas)
    m = turn.metrics
    assert m.stop_reason in ("eos", "length", "error")
    assert (m.error is not None) == (m.stop_reason == "error")
    if m.error is not None:
        assert m.error.strip() and "\n" not in m.error and "\r" not in m.error and len(m.error) < 400
    for name in ("prompt_tokens", "cached_tokens", "prefilled_tokens", "generated_tokens"):
        value = getattr(m, name)
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 0, (name, value)
    assert m.cached_tokens <= m.prompt_tokens and m.prefilled_tokens == m.prompt_tokens - m.cached_tokens
    for name in ("prefill_ms", "decode_ms", "total_ms", "cost_usd", "saved_usd"):
        value = getattr(m, name)
        assert math.isfinite(value) and value >= 0, (name, value)
    assert (m.ttft_ms is None) == (not deltas) and (m.ttft_ms is None or m.ttft_ms >= 0)
    history = conversation.history
    assert len(history) in (0, 2) and (len(history) == 2 or (m.stop_reason == "error" and not turn.reply))


@fuzz(120, deadline_s=10)
@given(reply_script=replies())
def test_any_stream_ends_the_turn_cleanly(engine, server, reply_script):
    check_turn(engine, reply_script, server)


# -- regressions found by the fuzzer -------------------------------------------------
@pytest.mark.parametrize("bad_usage", [
    {"prompt_tokens": -7, "completion_tokens": -1},
    {"prompt_tokens": "12", "completion_tokens": "x"},
    {"prompt_tokens": 1e400, "prompt_tokens_details": {"cached_tokens": math.nan}},
    {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": [1]}},
])
def test_usage_with_wrong_values_keeps_the_estimates(engine, server, bad_usage):
    body = data(chunk("Hi")) + data({"choices": [], "usage": bad_usage, "timings": {"prompt_ms": -3}}) + data("[DONE]")
    check_turn(engine, (200, "text/event-stream", [body.encode()], False), server)


def test_choices_that_are_not_a_list_are_ignored(engine, server):
    body = data(chunk("Hi")) + data({"choices": 5}) + data(chunk(finish="stop")) + data("[DONE]")
    server.reply = (200, "text/event-stream", [body.encode()], False)
    turn = Conversation(engine, PERSONA).send("Hello")
    assert "".join(turn.stream()) == "Hi" and turn.metrics.stop_reason == "eos"
