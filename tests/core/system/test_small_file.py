"""Small files read whole from places chatterm does not own: a FIFO (which a
plain read blocks on until a writer comes, forever), a folder, a huge file."""

from __future__ import annotations

import os
import threading

import pytest

from chatterm.core.config.tomlfile import read_toml
from chatterm.core.system.small_file import read_small
from chatterm.errors import ChattermError


def returns_soon(call):
    """`call()`'s result or exception, run in a thread that must end within 10 s."""
    out: list = []

    def run():
        try:
            out.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "blocked"
    return out[0]


def test_a_regular_file_within_the_limit_is_read_whole(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 100)
    assert read_small(tmp_path / "f", 100) == b"x" * 100


def test_a_fifo_a_folder_or_a_huge_file_is_an_oserror_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    fifo = returns_soon(lambda: read_small(tmp_path / "fifo", 1 << 20))
    assert isinstance(fifo, OSError) and fifo.strerror == "not a regular file"
    folder = returns_soon(lambda: read_small(tmp_path, 1 << 20))
    assert isinstance(folder, IsADirectoryError) and folder.strerror == "Is a directory"
    with open(tmp_path / "big", "wb") as fh:
        fh.truncate(3 << 30)  # sparse: nothing written, 3 GiB long
    big = returns_soon(lambda: read_small(tmp_path / "big", 1 << 20, "a manifest"))
    assert isinstance(big, OSError) and big.strerror == "3,221,225,472 bytes, more than the 1 MiB a manifest is"


def test_a_fifo_as_a_toml_file_is_one_line_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "models.toml")
    error = returns_soon(lambda: read_toml(tmp_path / "models.toml"))
    assert isinstance(error, ChattermError)
    assert str(error) == f"{tmp_path / 'models.toml'}: cannot read: not a regular file"


@pytest.mark.parametrize("text", ["x = 1\n", "[a]\nb = 'c'\r\n"])
def test_toml_reads_as_before(tmp_path, text):
    (tmp_path / "t.toml").write_text(text, newline="")
    assert read_toml(tmp_path / "t.toml") in ({"x": 1}, {"a": {"b": "c"}})
