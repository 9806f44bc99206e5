"""llama.cpp's log reaches Python logging with the right levels (the stock mapping hides errors)."""

import logging

from chatterm.core.engine.local import llama_log


def test_levels_follow_ggml_enum_and_lines_are_joined(caplog):
    caplog.set_level(logging.DEBUG, logger="llama.cpp")
    llama_log._emit(4, "load failed: ")   # GGML_LOG_LEVEL_ERROR
    llama_log._emit(5, "bad tensor\n")    # CONT: same line, same level
    llama_log._emit(3, "a warning\n")     # WARN
    llama_log._emit(2, "some info\n")     # INFO
    llama_log._emit(1, "debug detail\n")  # DEBUG
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "llama.cpp"]
    assert got == [
        (logging.ERROR, "load failed: bad tensor"),
        (logging.WARNING, "a warning"),
        (logging.INFO, "some info"),
        (logging.DEBUG, "debug detail"),
    ]


def test_the_callback_drops_debug_lines_only_when_nobody_reads_them(caplog):
    caplog.set_level(logging.INFO, logger="llama.cpp")
    llama_log._callback(1, b"tensor 1 of 2000\n", None)
    llama_log._callback(4, b"load failed: ", None)
    llama_log._callback(5, b"bad tensor\n", None)
    caplog.set_level(logging.DEBUG, logger="llama.cpp")
    llama_log._callback(1, b"now read\n", None)
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "llama.cpp"]
    assert got == [(logging.ERROR, "load failed: bad tensor"), (logging.DEBUG, "now read")]


def test_capture_errors_collects_only_errors():
    with llama_log.capture_errors() as errors:
        llama_log._emit(3, "just a warning\n")
        llama_log._emit(4, "tensor data is not within the file bounds\n")
    llama_log._emit(4, "after the block\n")
    assert errors == ["tensor data is not within the file bounds"]


# What llama.cpp 0.3.36 writes when a decode is stopped by the abort callback.
ABORT_LINES = [
    (4, "graph_compute: ggml_backend_sched_graph_compute_async failed with error 1\n"),
    (4, "process_ubatch: failed to compute graph, compute status: 1\n"),
    (3, "decode: removing memory module entries for seq_id = 0, pos = [0, +inf)\n"),
    (4, "llama_decode: failed to decode, ret = 2\n"),
]


def test_an_aborted_decode_is_debug_and_a_failed_one_stays_an_error(caplog):
    caplog.set_level(logging.DEBUG, logger="llama.cpp")
    for level, text in ABORT_LINES:
        llama_log._emit(level, text)
    assert [r.levelno for r in caplog.records] == [logging.DEBUG] * 4
    caplog.clear()
    # A real failure, and its roll-back, are not an abort: they keep their levels.
    llama_log._emit(3, "decode: removing memory module entries for seq_id = 0, pos = [0, +inf)\n")
    llama_log._emit(4, "llama_decode: failed to decode, ret = -3\n")
    llama_log._emit(4, "process_ubatch: failed to compute graph, compute status: -1\n")
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.ERROR, logging.ERROR]


def test_the_real_models_aborted_decode_logs_no_error_or_warning(caplog):
    from chatterm.core.config.catalog import load_catalog
    from chatterm.core.engine.local.model import AbortFlag, open_model

    opened = open_model(load_catalog().get(None))
    llm = opened.llm
    try:
        flag = AbortFlag()
        flag.install(llm)
        flag.set(True)
        caplog.set_level(logging.DEBUG, logger="llama.cpp")
        caplog.clear()
        try:
            llm.eval(llm.tokenize(b"hello world " * 40))
        except RuntimeError as exc:
            assert "returned 2" in str(exc)  # the decode was aborted, as asked
        else:
            raise AssertionError("the abort flag did not stop the decode")
        lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "llama.cpp"]
        assert any("ret = 2" in text for _, text in lines)
        assert [line for line in lines if line[0] >= logging.WARNING] == []
    finally:
        llm.close()


def test_lines_are_unread_only_when_every_handler_writes_to_fd_2(monkeypatch, tmp_path):
    root = logging.getLogger()
    terminal = logging.StreamHandler(open(2, "w", closefd=False))  # noqa: SIM115 - fd 2 stays open
    monkeypatch.setattr(llama_log.logger, "handlers", [])
    monkeypatch.setattr(root, "handlers", [terminal, logging.NullHandler()])
    assert llama_log.unread()
    log_file = logging.FileHandler(tmp_path / "launch.log", encoding="utf-8")
    try:
        monkeypatch.setattr(root, "handlers", [terminal, log_file])
        assert not llama_log.unread()
        monkeypatch.setattr(root, "handlers", [terminal])
        monkeypatch.setattr(llama_log.logger, "handlers", [log_file])
        assert not llama_log.unread()
        monkeypatch.setattr(llama_log.logger, "propagate", False)
        monkeypatch.setattr(llama_log.logger, "handlers", [terminal])
        monkeypatch.setattr(root, "handlers", [log_file])  # not reached: the logger does not propagate
        assert llama_log.unread()
        with llama_log.capture_errors():  # its collector reads them
            assert not llama_log.unread()
    finally:
        log_file.close()


def test_lines_are_unread_through_logging_s_last_resort_and_read_by_anything_else(monkeypatch):
    import io
    import sys

    terminal = open(2, "w", closefd=False)  # noqa: SIM115 - fd 2 stays open
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(llama_log.logger, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    assert llama_log.unread()  # no handler: logging's last resort, on sys.stderr
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not llama_log.unread()  # ... which now keeps what it is given
    monkeypatch.setattr(sys, "stderr", terminal)

    class Tee(io.TextIOWrapper):
        """fd 2, and somewhere else too."""

    class Forwarding(logging.StreamHandler):
        """A handler of its own kind might send lines anywhere."""

    tee = Tee(open(2, "wb", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.StreamHandler(tee)])
    assert not llama_log.unread()
    monkeypatch.setattr(logging.getLogger(), "handlers", [Forwarding(terminal)])
    assert not llama_log.unread()


def test_a_muted_load_logs_nothing_and_the_log_is_back_after_it(caplog):
    import llama_cpp

    from chatterm.core.workspace import Workspace

    caplog.set_level(logging.DEBUG, logger="llama.cpp")
    llama_log.install()
    path = str(Workspace.load().catalog.get(None).model_path()).encode()
    with llama_log.muted(llama_cpp) as quiet:
        model = llama_cpp.llama_model_load_from_file(path, llama_cpp.llama_model_default_params())
    assert model and quiet
    assert not [r for r in caplog.records if r.name == "llama.cpp"]
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 256
    ctx = llama_cpp.llama_init_from_model(model, params)
    try:
        assert ctx and any("llama_context" in r.getMessage() for r in caplog.records if r.name == "llama.cpp")
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
