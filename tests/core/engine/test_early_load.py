"""The model file's early load (`early_load`) on the real default model: the
engine's `Llama` takes it, any other load goes through, a failed one is
reported by the regular load, and a model nobody took is freed."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from dataclasses import replace

import llama_cpp
import pytest

from chatterm.core.engine.local import early_load as early_module
from chatterm.core.engine.local.early_load import begin, llama_model_params, same_params
from chatterm.core.engine.local.engine import LocalEngine
from chatterm.core.workspace import Workspace
from chatterm.errors import ChattermError
from tests.cli.test_cli_core import write_greedy_persona
from tests.conftest import CHATTERM, greedy, subprocess_env


@pytest.fixture
def ws(tmp_path):
    return Workspace.load()


def engine_for(ws, spec) -> LocalEngine:
    return LocalEngine(spec, ws.catalog.price(spec.price_profile), early=begin(spec))


@pytest.fixture(autouse=True)
def no_early_load_left():
    """A failed test leaves no pending early load for the next one."""
    yield
    if early_module._pending is not None:
        early_module._pending.close()


def test_the_engine_takes_the_early_model_and_answers(ws, caplog):
    caplog.set_level(logging.INFO, logger="llama.cpp")
    spec = ws.catalog.get(None)
    seen: list[float] = []
    interval = sys.getswitchinterval()
    engine = ws.make_engine(spec)
    early = engine._early
    engine.load(seen.append)
    try:
        assert early.outcome == "taken" and engine._early is None
        assert sys.getswitchinterval() == interval
        # The load's lines were logged, by the thread that took the model.
        loader = [r for r in caplog.records if r.name == "llama.cpp" and "llama_model_loader" in r.getMessage()]
        assert loader and {r.threadName for r in loader} == {threading.current_thread().name}
        turn = engine.start_turn(greedy(ws.personas.get(None), max_tokens=8), [], "Name a colour.")
        reply = "".join(turn.stream())
        assert turn.metrics.stop_reason != "error", turn.metrics.error
        assert reply.strip() and turn.metrics.generated_tokens > 0
    finally:
        engine.close()
    # The early load reported its progress (0..0.9), the engine the end.
    early_part = [p for p in seen if p < 1.0]
    assert early_part and max(early_part) <= 0.9 and seen[-1] == 1.0
    assert early_module._pending is None


def test_a_load_of_the_file_with_other_parameters_frees_the_early_model_first(ws):
    spec = ws.catalog.get(None)
    early = begin(spec)
    early._thread.join()  # done loading: it is freed, not stopped
    vocab = llama_cpp.Llama(str(spec.model_path()), vocab_only=True, verbose=False)
    assert early.outcome == "unused" and early_module._pending is None
    assert vocab.n_vocab() > 1000
    vocab.close()


def test_an_engine_closed_before_it_loaded_frees_its_early_model(ws):
    engine = ws.make_engine(ws.catalog.get(None))
    early = engine._early
    early._thread.join()
    engine.close()
    assert early.outcome == "unused" and early_module._pending is None


def test_a_failed_early_load_is_silent_and_the_regular_load_names_the_error(ws, tmp_path, capfd, caplog):
    truncated_path = tmp_path / "truncated.gguf"
    truncated_path.write_bytes(ws.catalog.get(None).model_path().read_bytes()[:50_000_000])
    spec = replace(ws.catalog.get(None), id="truncated", source=str(truncated_path))
    engine = engine_for(ws, spec)
    early = engine._early
    with pytest.raises(ChattermError) as info:
        engine.load()
    assert early.outcome == "failed"
    assert str(truncated_path) in str(info.value) and "not within the file bounds" in str(info.value)
    out, err = capfd.readouterr()
    assert "llama" not in out + err
    # The regular load logged llama.cpp's lines; the early one none.
    assert any(r.name == "llama.cpp" and r.threadName != "early-load" for r in caplog.records)
    assert not [r.getMessage() for r in caplog.records if r.threadName == "early-load"]


def test_a_load_nobody_reads_runs_muted_and_a_failed_one_is_named_by_the_regular_load(ws, tmp_path, caplog,
                                                                                     monkeypatch):
    from chatterm.core.engine.local import llama_log

    caplog.set_level(logging.DEBUG, logger="llama.cpp")
    monkeypatch.setattr(llama_log, "unread", lambda: True)  # as in `ask`, where pytest's handlers are not
    engine = engine_for(ws, ws.catalog.get(None))
    early = engine._early
    try:
        engine.load()
        assert early.muted and early.outcome == "taken"
        lines = [r.getMessage() for r in caplog.records if r.name == "llama.cpp"]
        # None of the model load's; the context made after it logs again.
        assert not [m for m in lines if "llama_model_loader" in m]
        assert [m for m in lines if "llama_context" in m]
    finally:
        engine.close()
    truncated_path = tmp_path / "truncated.gguf"
    truncated_path.write_bytes(ws.catalog.get(None).model_path().read_bytes()[:50_000_000])
    engine = engine_for(ws, replace(ws.catalog.get(None), id="truncated", source=str(truncated_path)))
    early = engine._early
    with pytest.raises(ChattermError) as info:
        engine.load()
    assert early.muted and early.outcome == "failed"
    assert "not within the file bounds" in str(info.value)


def test_a_regular_load_reports_its_progress_and_stops_when_told(ws):
    from chatterm.core.engine.local.model import open_model

    spec = ws.catalog.get(None)
    seen: list[float] = []
    opened = open_model(spec, seen.append)  # no early load pending: the regular load
    opened.llm.close()
    assert seen and seen == sorted(seen) and max(seen) <= 0.9
    told: list[float] = []
    with pytest.raises(ChattermError):
        open_model(spec, lambda value: told.append(value) or False)  # as a quit during the load answers
    assert told == [0.0]


def test_the_progress_callback_is_the_loading_thread_s_own(ws):
    path = str(ws.catalog.get(None).model_path()).encode()

    def load_here(into: list[bool]) -> None:
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_cpp.llama_model_load_from_file(path, params)  # the name `Llama` calls
        into.append(bool(params.progress_callback))
        llama_cpp.llama_model_free(model)

    mine: list[bool] = []
    other: list[bool] = []
    with early_module.reporting(lambda value: True):
        thread = threading.Thread(target=load_here, args=(other,))
        thread.start()
        thread.join()
        load_here(mine)
    assert mine == [True] and other == [False]


def test_a_load_of_another_file_waits_for_a_muted_early_load(ws, tmp_path, monkeypatch):
    from chatterm.core.engine.local import llama_log

    monkeypatch.setattr(llama_log, "unread", lambda: True)
    spec = ws.catalog.get(None)
    early = begin(spec)
    other = tmp_path / "other.gguf"
    other.symlink_to(spec.model_path())  # another path: not the early load's
    try:
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_cpp.llama_model_load_from_file(str(other).encode(), params)
        # Its lines (an error's, say) could not have fallen into the mute.
        assert early.muted and not early._thread.is_alive()
        llama_cpp.llama_model_free(model)
    finally:
        early.close()


def test_a_load_with_layers_on_a_gpu_is_never_muted(ws, monkeypatch):
    # Its usual failure, out of GPU memory, would be reached twice: muted, then to be named.
    from chatterm.core.engine.local import llama_log, offload

    monkeypatch.setattr(llama_log, "unread", lambda: True)
    real_plan = offload.plan_offload
    monkeypatch.setattr(offload, "plan_offload", lambda spec, gpu: replace(real_plan(spec, gpu), n_gpu_layers=-1))
    early = begin(ws.catalog.get(None))
    try:
        assert early._thread is not None and not early.muted
    finally:
        early.close()


def test_a_remote_model_has_no_early_load(ws):
    remote = replace(ws.catalog.get(None), id="remote", kind="openai", source="")
    early = begin(remote)
    early.close()
    assert early.outcome == "none"


def test_parameters_compare_by_value_and_by_null_pointers():
    base = llama_model_params(llama_cpp, 0)
    assert same_params(base, llama_model_params(llama_cpp, 0))
    assert not same_params(base, llama_model_params(llama_cpp, 4))
    split = llama_model_params(llama_cpp, 0)
    values = (llama_cpp.ctypes.c_float * 1)(1.0)
    split.tensor_split = llama_cpp.ctypes.cast(values, llama_cpp.ctypes.POINTER(llama_cpp.ctypes.c_float))
    assert not same_params(base, split)


def test_ask_loads_the_file_while_llama_cpp_python_imports_and_prints_nothing_of_it(tmp_path):
    # A fresh process: llama_cpp is not imported yet, so the import hook starts
    # the load (the in-process tests above start it at once).
    write_greedy_persona(tmp_path)

    def ask(*options: str) -> subprocess.CompletedProcess:
        result = subprocess.run([*CHATTERM, *options, "ask", "--persona", "quick", "Name a colour."],
                                capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                env=subprocess_env(tmp_path), cwd=tmp_path, timeout=300)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()
        return result

    verbose = ask("-v")
    # Muted: its lines would go to stderr, where llama-cpp-python drops them.
    assert "early model load started (while llama_cpp imports, muted)" in verbose.stderr
    assert "early model load: taken" in verbose.stderr
    # Had llama-cpp-python's own log callback replaced chatterm's during the
    # load, the rest of the load's ~1,000 lines would be on stderr.
    plain = ask()
    lines = plain.stderr.strip().splitlines()  # the metrics line, then the new session's id
    assert "llama" not in plain.stderr and len(lines) == 2 and lines[1].startswith("session "), plain.stderr


def test_closing_a_load_that_still_runs_stops_it(ws):
    early = begin(ws.catalog.get(None))
    # Not a daemon: an interpreter that shut down with the load still in
    # llama.cpp crashed (SIGSEGV), so shutdown must wait for it.
    assert early._thread is not None and not early._thread.daemon
    early.close()  # at once: the load's first progress callback answers False
    assert early.outcome == "failed" and early_module._pending is None


def test_an_engine_that_fails_to_be_made_closes_its_early_load(ws, monkeypatch):
    started = []
    real_begin = early_module.begin

    def recording_begin(spec):
        started.append(real_begin(spec))
        return started[-1]

    monkeypatch.setattr(early_module, "begin", recording_begin)
    monkeypatch.setattr(Workspace, "kv_cache", lambda self: (_ for _ in ()).throw(OSError("no cache folder")))
    with pytest.raises(OSError):
        ws.make_engine(ws.catalog.get(None))
    assert started and started[0].outcome in ("failed", "unused") and early_module._pending is None
