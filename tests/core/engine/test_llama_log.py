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


def test_capture_errors_collects_only_errors():
    with llama_log.capture_errors() as errors:
        llama_log._emit(3, "just a warning\n")
        llama_log._emit(4, "tensor data is not within the file bounds\n")
    llama_log._emit(4, "after the block\n")
    assert errors == ["tensor data is not within the file bounds"]
