"""RemoteEngine against real servers on 127.0.0.1.

- llama-cpp-python's own OpenAI-compatible server (`python -m llama_cpp.server`,
  the `server` extra) with the default model, started once for the module and
  protected by an API key: streamed chat, cancel, the metrics path, a wrong key.
- A tiny `http.server` handler for what a healthy llama.cpp server will not do
  on demand: HTTP 500 with a JSON reason, malformed events, `usage` with cached
  tokens, a stream cut short, a silent server.
- A port where nothing listens.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from chatterm.core.config.catalog import ModelSpec, PriceProfile, load_catalog
from chatterm.core.config.personas import Persona, Sampling
from chatterm.core.engine.conversation import Conversation
from chatterm.core.engine.interface import ChatMessage
from chatterm.core.engine.remote import RemoteEngine, estimate_prompt_tokens
from chatterm.core.store.session_store import SessionStore
from chatterm.errors import ChattermError

pytestmark = pytest.mark.timeout(120)

KEY_ENV = "CHATTERM_TEST_REMOTE_KEY"
SERVER_KEY = "sk-test-7f3a9c2e41d8b6"
"""The key the llama.cpp server accepts; tests check it never shows up in output."""
PRICE = PriceProfile(id="test-price", label="Test", input_per_m=2.0, cached_input_per_m=0.5,
                     output_per_m=8.0, as_of="2025-01-01")
SERVER_START_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_spec(base_url: str, **overrides) -> ModelSpec:
    values = dict(
        id="remote-test",
        label="remote test",
        kind="openai",
        price_profile=PRICE.id,
        n_ctx=2048,
        base_url=base_url,
        remote_model="smollm2",
        api_key_env=KEY_ENV,
        connect_timeout_s=2.0,
        read_timeout_s=30.0,
    )
    values.update(overrides)
    return ModelSpec(**values)


def make_persona(max_tokens: int = 24, prompt: str = "You are a helpful assistant.") -> Persona:
    return Persona(
        id="tester",
        name="Tester",
        system_prompt=prompt,
        sampling=Sampling(temperature=0.0, top_p=1.0, max_tokens=max_tokens),
    )


def drain(turn) -> list[str]:
    return list(turn.stream())


# -- llama-cpp-python's server -----------------------------------------------


class LlamaServer:
    def __init__(self, url: str, log: Path, proc: subprocess.Popen):
        self.url = url
        self.log = log
        self.proc = proc

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    model = load_catalog().get(None).model_path()
    port = free_port()
    log = tmp_path_factory.mktemp("llama_server") / "server.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # its "disconnected" line must reach the log
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "llama_cpp.server",
                "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
                "--n_ctx", "2048", "--api_key", SERVER_KEY, "--verbose", "False",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                hint = ""
                if proc.returncode == -11:
                    # Seen with a -march=native build on a VM that reports AMX without
                    # enabling it: llama.cpp faults at `ldtilecfg` on the first matmul.
                    hint = " (SIGSEGV: rebuild llama-cpp-python with CMAKE_ARGS=-DGGML_NATIVE=OFF)"
                pytest.fail(
                    f"llama_cpp.server exited ({proc.returncode}){hint}:\n{log.read_text()[-2000:]}"
                )
            try:
                r = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {SERVER_KEY}"}, timeout=1)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer within {SERVER_START_S} s")
            time.sleep(0.2)
        yield LlamaServer(url, log, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def server_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SERVER_KEY)


@pytest.fixture
def engine(llama_server, server_key):
    eng = RemoteEngine(make_spec(llama_server.url), PRICE)
    eng.load()
    yield eng
    eng.close()


def test_streamed_chat_fills_metrics_and_history(engine, llama_server):
    conv = Conversation(engine, make_persona())
    first = conv.send("Say hello in one short sentence.")
    deltas = drain(first)
    m = first.metrics

    assert deltas and first.reply == "".join(deltas) and first.reply.strip()
    assert m.error is None, m.error
    assert m.engine == "openai" and m.model_id == "remote-test"
    assert m.stop_reason in ("eos", "length")
    assert m.ttft_ms is not None and 0 < m.ttft_ms <= m.total_ms
    # llama-cpp-python's server streams one token per event and sends no usage.
    assert m.generated_tokens == len(deltas)
    assert m.tokens_estimated is True and m.prompt_tokens > 0
    assert m.cache_outcome == "server" and m.cached_tokens == 0
    assert m.prefilled_tokens == m.prompt_tokens
    if m.generated_tokens >= 2:
        assert m.decode_tok_s is not None and m.decode_tok_s > 0
    # Cost comes from the Turn machinery with the engine's price profile.
    assert m.price_profile == PRICE.id
    assert m.cost_output_usd == pytest.approx(m.generated_tokens * PRICE.output_per_m / 1e6)
    assert m.cost_input_usd == pytest.approx(m.prompt_tokens * PRICE.input_per_m / 1e6)
    assert m.cost_usd > 0

    second = conv.send("Now say goodbye.")
    drain(second)
    assert second.metrics.error is None
    assert [h.role for h in conv.history] == ["user", "assistant", "user", "assistant"]
    assert conv.history[1].content == first.reply
    # The second prompt carries the first exchange.
    assert second.metrics.prompt_tokens > m.prompt_tokens
    assert [t.stop_reason for t in conv.turns] == [m.stop_reason, second.metrics.stop_reason]

    info = engine.device()
    assert info.backend == "remote" and info.name == llama_server.url and info.n_ctx == 2048
    # llama-cpp-python lists the model by its file path, not "smollm2": a note, not an error.
    assert any("smollm2" in note for note in info.notes)
    assert engine.model_identity == f"{llama_server.url}#smollm2"


def test_cancel_closes_the_stream_and_the_server_stops(engine, llama_server):
    turn = engine.start_turn(make_persona(max_tokens=1500), [], "Count from 1 to 500, one number per line.")
    deltas: list[str] = []
    after_cancel = 0
    for delta in turn.stream():
        deltas.append(delta)
        if len(deltas) == 3:
            # Cancel from another thread, as the TUI's Esc does.
            t = threading.Thread(target=turn.cancel)
            t.start()
            t.join()
        elif len(deltas) > 3:
            after_cancel += 1
    m = turn.metrics
    assert m.stop_reason == "cancelled" and m.error is None
    assert turn.reply == "".join(deltas) and len(deltas) >= 3
    # Checked before every event: nothing is yielded after the cancel.
    assert after_cancel == 0
    assert m.generated_tokens == len(deltas)
    # The server noticed the closed connection and stopped generating: it prints
    # this only when a stream is cancelled, never when a reply finishes.
    deadline = time.monotonic() + 15
    while "Disconnected from client" not in llama_server.log_text():
        assert time.monotonic() < deadline, "server kept generating after the stream was closed"
        time.sleep(0.1)
    # The engine is usable again at once.
    after = engine.start_turn(make_persona(max_tokens=4), [], "Hi")
    drain(after)
    assert after.metrics.error is None and after.reply


def test_prompt_over_the_server_context_is_explained(engine):
    # ~2,500 real tokens against the server's 2,048: llama-cpp-python fails inside
    # the stream and just ends it. The turn must say why, not hang or crash.
    persona = make_persona(prompt="You are a helpful assistant. " + "word " * 2500)
    turn = engine.start_turn(persona, [], "Hello")
    drain(turn)
    m = turn.metrics
    assert m.stop_reason == "error" and "may exceed its context" in m.error
    assert any("may not fit the 2048-token context" in n for n in turn.notices)
    after = engine.start_turn(make_persona(max_tokens=4), [], "Hi")
    drain(after)
    assert after.metrics.error is None


def test_wrong_api_key_is_refused_and_never_shown(llama_server, monkeypatch):
    wrong = "sk-wrong-5be1c0ffee9d"
    monkeypatch.setenv(KEY_ENV, wrong)
    eng = RemoteEngine(make_spec(llama_server.url), PRICE)
    with pytest.raises(ChattermError) as err:
        eng.load()
    msg = str(err.value)
    assert "401" in msg and llama_server.url in msg and KEY_ENV in msg
    assert wrong not in msg and "\n" not in msg

    turn = eng.start_turn(make_persona(), [], "Hello")
    drain(turn)
    m = turn.metrics
    assert m.stop_reason == "error" and "401" in m.error and "Invalid API key" in m.error
    for text in (m.error, repr(eng), eng.model_identity, eng.device().name,
                 json.dumps(m.to_dict()), json.dumps(turn.request)):
        assert wrong not in text and SERVER_KEY not in text
    eng.close()


def test_missing_key_variable_is_named(llama_server, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    eng = RemoteEngine(make_spec(llama_server.url), PRICE)
    with pytest.raises(ChattermError, match=KEY_ENV):
        eng.load()
    turn = eng.start_turn(make_persona(), [], "Hello")
    drain(turn)
    assert turn.metrics.stop_reason == "error" and KEY_ENV in turn.metrics.error


# -- nothing listening ---------------------------------------------------------


def test_nothing_listening_is_one_clean_line(server_key):
    url = f"http://127.0.0.1:{free_port()}/v1"
    eng = RemoteEngine(make_spec(url), PRICE)
    with pytest.raises(ChattermError) as err:
        eng.load()
    assert url in str(err.value) and "cannot connect" in str(err.value)
    assert "\n" not in str(err.value)

    turn = eng.start_turn(make_persona(), [], "Hello")
    assert drain(turn) == []
    m = turn.metrics
    assert m.stop_reason == "error" and url in m.error and "\n" not in m.error
    assert m.ttft_ms is None and m.generated_tokens == 0
    eng.close()


# -- a scripted server ---------------------------------------------------------


class ScriptedServer(ThreadingHTTPServer):
    """Answers POST /v1/chat/completions with `self.script(handler)` and records requests."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), ScriptedHandler)
        self.script = None
        self.get_script = None
        self.requests: list[dict] = []
        self.release = threading.Event()
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"

    def handle_error(self, request, client_address):
        pass  # a client that hung up (cancel, timeout) is what these tests want


class ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        if self.server.get_script is not None:
            return self.server.get_script(self)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.requests.append(
            {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
        )
        self.server.script(self)

    # helpers for scripts
    def start_events(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

    def event(self, data):
        text = data if isinstance(data, str) else json.dumps(data)
        self.wfile.write(f"data: {text}\n\n".encode())
        self.wfile.flush()


def chunk(content=None, finish=None):
    delta = {} if content is None else {"content": content}
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


@pytest.fixture
def scripted(server_key):
    server = ScriptedServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_http_500_surfaces_the_reason_without_the_key(scripted):
    def script(h):
        # A careless server echoing the credentials back must not leak them.
        body = json.dumps({"error": {"message": f"model exploded (auth {h.headers['Authorization']})",
                                     "type": "internal_server_error"}}).encode()
        h.send_response(500)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    scripted.script = script
    eng = RemoteEngine(make_spec(scripted.url), PRICE)
    eng.load()  # 404 on /models is tolerated
    turn = eng.start_turn(make_persona(), [], "Hello")
    drain(turn)
    m = turn.metrics
    assert m.stop_reason == "error"
    assert "HTTP 500" in m.error and "model exploded" in m.error and scripted.url in m.error
    assert SERVER_KEY not in m.error and "***" in m.error
    assert scripted.requests[0]["headers"]["Authorization"] == f"Bearer {SERVER_KEY}"
    eng.close()


def test_url_credentials_are_sent_as_basic_auth_and_never_logged(scripted, monkeypatch, caplog):
    import base64
    import logging

    monkeypatch.delenv(KEY_ENV)
    scripted.script = lambda h: (h.start_events(), h.event(chunk("ok", "stop")), h.event("[DONE]"))
    url = scripted.url.replace("http://", "http://alice:p%40ss-URLSECRET@")
    eng = RemoteEngine(make_spec(url, api_key_env=""), PRICE)
    with caplog.at_level(logging.DEBUG):  # what `-v` and launch.log get
        eng.load()
        assert drain(eng.start_turn(make_persona(), [], "Hello")) == ["ok"]
    sent = scripted.requests[0]["headers"]["Authorization"]
    assert sent == "Basic " + base64.b64encode(b"alice:p@ss-URLSECRET").decode()
    assert any("HTTP Request" in r.getMessage() for r in caplog.records)
    assert "URLSECRET" not in caplog.text and "alice" not in caplog.text
    eng.close()


def test_malformed_event_ends_the_turn_and_keeps_the_partial_reply(scripted):
    def script(h):
        h.start_events()
        h.event(chunk("Hel"))
        h.event("{not json")
        h.event(chunk("lo"))
        h.event("[DONE]")

    scripted.script = script
    eng = RemoteEngine(make_spec(scripted.url), PRICE)
    turn = eng.start_turn(make_persona(), [], "Hello")
    assert drain(turn) == ["Hel"]
    m = turn.metrics
    assert turn.reply == "Hel" and m.stop_reason == "error"
    assert "malformed event" in m.error and "{not json" in m.error
    assert m.ttft_ms is not None and m.generated_tokens == 1
    eng.close()


def test_surrogate_halves_are_joined_across_events_or_replaced_and_the_turn_is_stored(scripted, tmp_path):
    """JSON may escape an emoji as two halves, and a server may split them over
    two events or send one alone: a lone surrogate can neither be written to
    a terminal nor stored as UTF-8 (the turn was lost)."""
    def script(h):
        h.start_events()
        for part in ("smile \ud83d", "\ude00 then \udc00 and", " \ud83d"):
            h.event(chunk(part))  # json.dumps escapes each half as \uXXXX
        h.event(chunk(finish="stop"))
        h.event("[DONE]")

    scripted.script = script
    eng = RemoteEngine(make_spec(scripted.url), PRICE)
    turn = eng.start_turn(make_persona(), [], "Hello")
    assert "".join(drain(turn)) == turn.reply == "smile \U0001f600 then \ufffd and \ufffd"
    assert turn.metrics.stop_reason == "eos"
    eng.close()
    with SessionStore(tmp_path / "s.db") as store:
        sid = store.create_session(model_id="m", model_identity="x", engine="remote", device="server",
                                   persona_id="assistant")
        assert store.record_turn(sid, "Hello", turn.reply, turn.metrics) is not None
        assert store.turns(sid)[0].reply == turn.reply
        # Whatever else hands the store a lone surrogate: refused like a full disk, never raised.
        assert store.record_turn(sid, "again", "half \ud83d", turn.metrics) is None
        assert "surrogates not allowed" in store.write_error


@pytest.mark.parametrize(
    "error_event",
    [
        {"error": {"message": "KV cache exhausted", "type": "server_error"}},  # OpenAI shape
        {"object": "error", "message": "KV cache exhausted", "code": 500},  # older vLLM
    ],
)
def test_error_event_mid_stream_surfaces_its_message(scripted, error_event):
    def script(h):
        h.start_events()
        h.event(chunk("Par"))
        h.event(error_event)

    scripted.script = script
    eng = RemoteEngine(make_spec(scripted.url), PRICE)
    turn = eng.start_turn(make_persona(), [], "Hello")
    drain(turn)
    assert turn.reply == "Par" and turn.metrics.stop_reason == "error"
    assert "KV cache exhausted" in turn.metrics.error
    eng.close()


def test_a_reply_that_is_not_a_stream_is_an_error(scripted):
    def script(h):
        body = json.dumps({"message": "streaming disabled on this deployment"}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    scripted.script = script
    eng = RemoteEngine(make_spec(scripted.url), PRICE)
    turn = eng.start_turn(make_persona(), [], "Hello")
    drain(turn)
    assert turn.metrics.stop_reason == "error"
    assert "did not stream" in turn.metrics.error and "streaming disabled" in turn.metrics.error
    eng.close()


def test_request_shape_and_usage_with_cached_tokens(scripted):
    def script(h):
        h.start_events()
        h.event({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
        for piece in ("One", " two", " three"):
            h.event(chunk(piece))
        h.event(chunk(finish="length"))
        h.event({"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 3, "total_tokens": 53,
                                          "prompt_tokens_details": {"cached_tokens": 32}}})
        h.event("[DONE]")

    scripted.script = script
    eng = RemoteEngine(make_spec(scripted.url), PRICE)
    history = [ChatMessage("user", "Earlier question"), ChatMessage("assistant", "Earlier answer")]
    persona = make_persona(max_tokens=3, prompt="You count.")
    turn = eng.start_turn(persona, history, "Count")
    assert "".join(drain(turn)) == "One two three"

    body = scripted.requests[0]["body"]
    assert scripted.requests[0]["path"] == "/v1/chat/completions"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "smollm2"
    assert body["messages"] == [
        {"role": "system", "content": "You count."},
        {"role": "user", "content": "Earlier question"},
        {"role": "assistant", "content": "Earlier answer"},
        {"role": "user", "content": "Count"},
    ]
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.0, 1.0, 3)

    m = turn.metrics
    assert m.stop_reason == "length" and m.error is None
    assert (m.prompt_tokens, m.cached_tokens, m.prefilled_tokens, m.generated_tokens) == (50, 32, 18, 3)
    assert m.tokens_estimated is False and "32 cached" in m.cache_detail
    assert m.cost_input_usd == pytest.approx(18 * 2.0 / 1e6)
    assert m.cost_cached_input_usd == pytest.approx(32 * 0.5 / 1e6)
    assert m.cost_output_usd == pytest.approx(3 * 8.0 / 1e6)
    assert m.saved_usd == pytest.approx(32 * 1.5 / 1e6)
    eng.close()


def test_past_the_context_the_cut_is_sticky_so_requests_share_their_prefix(scripted):
    def script(h):
        h.start_events()
        h.event(chunk("ok", finish="stop"))
        h.event("[DONE]")

    scripted.script = script
    # n_ctx 512 with 64 tokens for the reply leaves 448 prompt tokens; a turn
    # of two 160-character messages is about 90 (4 characters per token + 4).
    eng = RemoteEngine(make_spec(scripted.url, n_ctx=512), PRICE)
    persona = make_persona(max_tokens=64)
    history: list[ChatMessage] = []
    sent, metrics, notices = [], [], []
    for i in range(14):
        question = f"question {i} " + "q" * 150
        turn = eng.start_turn(persona, list(history), question)
        drain(turn)
        sent.append(scripted.requests[-1]["body"]["messages"])
        metrics.append(turn.metrics)
        notices.append(turn.notices)
        history += [ChatMessage("user", question), ChatMessage("assistant", f"answer {i} " + "a" * 150)]
    assert all(m.error is None for m in metrics)
    for body in sent:
        assert body[0]["role"] == "system" and body[1]["role"] == "user"  # never starts with a reply
        assert estimate_prompt_tokens(body) + 64 <= 512
    moves = [i for i, m in enumerate(metrics) if m.cut_turns]
    assert len(moves) >= 2  # the context filled more than once
    for i in moves:  # a move frees half the budget, and says so
        assert estimate_prompt_tokens(sent[i]) <= 448 // 2
        assert any(f"dropped the oldest {metrics[i].cut_turns} turn" in n for n in notices[i])
    for i in range(1, len(sent)):
        if i not in moves:  # between moves the prompt only grows: the previous one is its prefix
            assert sent[i][: len(sent[i - 1]) - 1] == sent[i - 1][:-1]
            assert metrics[i].dropped_turns == metrics[i - 1].dropped_turns and not notices[i]
    # Fewer moves than turns past the context: the fewest-dropped rule would cut on every one.
    overflowing = [i for i, m in enumerate(metrics) if m.dropped_turns]
    assert len(moves) * 2 <= len(overflowing)
    eng.close()


def test_stream_cut_short_is_an_error(scripted):
    def script(h):
        h.start_events()
        h.event(chunk("partial"))
        # then the connection closes: no finish_reason, no [DONE]

    scripted.script = script
    eng = RemoteEngine(make_spec(scripted.url), PRICE)
    turn = eng.start_turn(make_persona(), [], "Hello")
    drain(turn)
    assert turn.reply == "partial" and turn.metrics.stop_reason == "error"
    assert "before the reply finished" in turn.metrics.error
    eng.close()


def test_read_timeout_is_reported(scripted):
    def script(h):
        h.start_events()
        scripted.release.wait(10)

    scripted.script = script
    eng = RemoteEngine(make_spec(scripted.url, read_timeout_s=0.3), PRICE)
    turn = eng.start_turn(make_persona(), [], "Hello")
    drain(turn)
    assert turn.metrics.stop_reason == "error" and "read_timeout_s" in turn.metrics.error
    eng.close()


def test_load_reports_a_server_that_accepts_but_never_answers(scripted):
    scripted.get_script = lambda h: scripted.release.wait(10)
    eng = RemoteEngine(make_spec(scripted.url, read_timeout_s=0.3), PRICE)
    with pytest.raises(ChattermError, match=r"no data for 0\.3 s") as err:
        eng.load()
    assert scripted.url in str(err.value)
    eng.close()


def test_cancel_wakes_a_reader_waiting_on_a_silent_server(scripted):
    def script(h):
        h.start_events()
        h.event(chunk("thinking"))
        scripted.release.wait(30)  # silent, like a long prefill on a busy server
        h.event(chunk(" late", finish="stop"))

    scripted.script = script
    eng = RemoteEngine(make_spec(scripted.url), PRICE)
    turn = eng.start_turn(make_persona(), [], "Hello")
    # Watchdog: if the reader is still waiting after 10 s, let the server go on.
    watchdog = threading.Timer(10, scripted.release.set)
    watchdog.start()
    deltas = []
    for delta in turn.stream():
        deltas.append(delta)
        threading.Timer(0.2, turn.cancel).start()
    watchdog.cancel()
    # The stream ended while the server was still holding its next event.
    assert not scripted.release.is_set()
    assert deltas == ["thinking"] and turn.reply == "thinking"
    assert turn.metrics.stop_reason == "cancelled" and turn.metrics.error is None
    eng.close()


def test_models_toml_entry_makes_a_remote_engine(tmp_path, monkeypatch):
    from chatterm.core.workspace import Workspace

    monkeypatch.setenv("CHATTERM_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CHATTERM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CHATTERM_CACHE_DIR", str(tmp_path / "cache"))
    models = tmp_path / "models.toml"
    models.write_text(
        '[defaults]\nmodel = "served"\n'
        '[models.served]\nkind = "openai"\nbase_url = "http://user:pw@127.0.0.1:9/v1/"\n'
        f'model = "llama-3"\napi_key_env = "{KEY_ENV}"\nn_ctx = 4096\nread_timeout_s = 7\n'
        'price_profile = "p"\n'
        '[prices.p]\ninput = 1.0\noutput = 2.0\nas_of = "2025-01-01"\n'
    )
    ws = Workspace.load(models)
    eng = ws.make_engine(ws.catalog.get("served"))
    assert isinstance(eng, RemoteEngine) and eng.kind == "openai"
    # Credentials in the URL are kept out of what the store and export see.
    assert eng.model_identity == "http://127.0.0.1:9/v1#llama-3"
    assert eng.device().name == "http://127.0.0.1:9/v1" and eng.device().n_ctx == 4096
    assert "pw" not in repr(eng)
    assert eng.client.timeout.read == 7
    # A key pasted where its variable's name goes is refused, and not echoed.
    models.write_text(models.read_text().replace(f'api_key_env = "{KEY_ENV}"', 'api_key_env = "sk-abc123SECRET"'))
    catalog = load_catalog(models)
    assert "served" not in catalog.models
    (error,) = [e for e in catalog.errors if "api_key_env" in e]
    assert "name of an environment variable" in error and "SECRET" not in error


def test_bench_runs_against_the_server(engine):
    from chatterm.core.bench.runner import run_bench

    result = run_bench(engine, make_persona(), runs=2, max_tokens=4)
    assert result["engine"] == "openai"
    assert result["ttft_ms"] is not None and result["ttft_ms"] > 0
    assert len(result["ttft_runs_ms"]) == 2
