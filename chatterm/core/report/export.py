"""Export of session latency logs: JSONL, CSV, a Markdown report and an HTML report.

Contract (the field list with units is docs/export-format.md):
- One row per computed turn, on every branch (a regenerated reply keeps its
  own row, TTFT and cost). `ROW_FIELDS` is the stable column order shared by
  JSONL and CSV: session fields, `turn_index` (from 1), every `TURN_FIELDS`
  metric, the turn's place in the conversation tree (`BRANCH_FIELDS`:
  `parent_index`, `branch`, `inherited`), and `user_chars` / `reply_chars`.
  `engine`, `model_id` and `persona_id` are the turn's own values (chatterm
  keeps them equal to the session's).
- JSONL also carries the texts (`user_text`, `reply`) and is exact: control
  characters are escaped (`chatterm.core.report.escape.json_line`), so it is safe to
  print on a terminal; timestamps (`_at`)
  are Unix seconds. CSV carries no conversation text: it is made for
  spreadsheets, so timestamps are ISO 8601 UTC and text cells that start like a
  formula are neutralized (`chatterm.core.report.escape.csv_cell`).
- `md` and `html` are reports over one or several sessions (`chatterm.core.report.figures`
  computes, `md_report` / `html_report` format): charts, per-turn timelines and
  per-token costs, the cost split and a what-if under every price profile given
  in `prices` (the catalog's). Every string is escaped for its format.
- `sessions_to_export` checks the ids before anything is written: an unknown
  id, or a session without turns (nothing to report) unless asked to skip
  such sessions (`--all`), is a ChattermError.
- `export_chunks` renders: JSONL and CSV stream from the store's flat rows a
  session at a time (100,000 turns never sit in memory at once), and from
  `PARALLEL_TURNS` turns on a forked worker renders the second half of the
  sessions meanwhile (same bytes, in the same order); the reports read every
  turn's metrics first. Rendering only reads the store. Writing a
  file is atomic (a temp file in the same folder, then a rename): a failure
  leaves the old file or nothing.
"""

from __future__ import annotations

import csv
import io
import math
import multiprocessing
import operator
import os
import tempfile
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from chatterm.core.config import paths
from chatterm.core.config.catalog import PriceProfile
from chatterm.core.metrics.turn_metrics import TURN_FIELDS, TurnMetrics
from chatterm.core.report.escape import csv_cell, csv_keeps, json_line, plain_float
from chatterm.core.report.figures import Exported, build
from chatterm.core.report.html import render_html
from chatterm.core.report.markdown import render_markdown
from chatterm.core.store.session_store import SessionInfo, SessionStore, TurnRecord
from chatterm.core.system.atomic import replace_output
from chatterm.errors import ChattermError

FORMATS = ("jsonl", "csv", "md", "html")
REPORT_FORMATS = ("md", "html")
"""Formats that chart and compare sessions (and use price profiles)."""

SESSION_FIELDS = ("session_id", "session_started_at", "model_identity", "device")
BRANCH_FIELDS = ("parent_index", "branch", "inherited")
"""The turn before it on its path (null: a first turn), its branch ("main",
or "b<N>": the branch turn N started), and whether it was copied from the
session this one was forked from."""
ROW_FIELDS: tuple[str, ...] = (
    SESSION_FIELDS + ("turn_index",) + TURN_FIELDS + BRANCH_FIELDS + ("user_chars", "reply_chars")
)
"""The CSV columns, and the JSONL keys before `TEXT_FIELDS`."""
TEXT_FIELDS = ("user_text", "reply")
"""JSONL only."""

# -- choosing sessions ----------------------------------------------------------
def sessions_to_export(
    store: SessionStore,
    session_ids: Iterable[int],
    *,
    skip_empty: bool = False,
    infos: Mapping[int, SessionInfo] | None = None,
) -> list[SessionInfo]:
    """The sessions to export, checked before anything is written (`infos`: the
    sessions' infos, already read). An unknown id, or a session without turns
    (unless `skip_empty`: then it is left out), is a ChattermError."""
    chosen = []
    for sid in session_ids:
        info = infos[sid] if infos is not None and sid in infos else store.session(sid)
        if not info.turns:
            if skip_empty:
                continue
            raise ChattermError(f"session {sid} has no turns to export")
        chosen.append(info)
    return chosen


def collect(store: SessionStore, sessions: Iterable[SessionInfo]) -> list[tuple[SessionInfo, list[TurnRecord]]]:
    """Sessions with their turns, for the reports (which compute over the metrics)."""
    return [(info, store.all_turns(info.id)) for info in sessions]


# -- formats -------------------------------------------------------------------
def export_chunks(
    store: SessionStore,
    sessions: Sequence[SessionInfo],
    fmt: str,
    prices: Mapping[str, PriceProfile] | None = None,
) -> Iterator[bytes]:
    """`sessions` in format `fmt` as UTF-8 chunks (about one session each for
    JSONL and CSV, which stream: memory does not grow with the database);
    `prices` feed the reports' what-if tables."""
    if fmt in _STREAMED:
        return _streamed(store, sessions, fmt)
    if fmt in REPORT_FORMATS:
        return iter([render_report(collect(store, sessions), fmt, prices).encode("utf-8")])
    raise ChattermError(f"unknown export format {fmt!r}; use one of: {', '.join(FORMATS)}")


PARALLEL_TURNS = 20_000
"""From this many turns on, JSONL and CSV are rendered by two processes."""


def _streamed(store: SessionStore, sessions: Sequence[SessionInfo], fmt: str) -> Iterator[bytes]:
    """JSONL or CSV. Big exports use a second core: building 100,000 rows' Python
    objects, not reading or writing, is what takes the time. A forked worker
    renders the second half of the sessions (by turns) into a temp file while
    this process renders and hands out the first; the worker's part follows."""
    render = _STREAMED[fmt]
    total = sum(info.turns for info in sessions)
    if total < PARALLEL_TURNS or len(sessions) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        yield from render(store, sessions, header=True)
        return
    done, split = 0, len(sessions) - 1
    for n, info in enumerate(sessions):
        done += info.turns
        if done * 2 >= total:
            split = min(n + 1, len(sessions) - 1)
            break
    fd, part = tempfile.mkstemp(prefix="chatterm-export-", suffix=".part")
    os.close(fd)
    context = multiprocessing.get_context("fork")
    reply, report = context.Pipe(duplex=False)
    worker = context.Process(target=_render_part, args=(store.path, sessions[split:], fmt, part, report), daemon=True)
    try:
        worker.start()
        report.close()
        yield from render(store, sessions[:split], header=True)
        try:
            failure = reply.recv()
        except EOFError:
            failure = "the export worker ended without a word"
        worker.join()
        if failure is not None or worker.exitcode != 0:
            raise ChattermError(f"export: {failure or f'the export worker exited with status {worker.exitcode}'}")
        with open(part, "rb") as fh:
            while chunk := fh.read(1 << 20):
                yield chunk
    finally:
        if worker.is_alive():
            worker.kill()
            worker.join()
        reply.close()
        os.unlink(part)


def _render_part(db: Path, sessions: Sequence[SessionInfo], fmt: str, part: str, report) -> None:
    """The forked worker: render `sessions` (no CSV header) into `part`, then
    send None, or the one-line reason it failed. It opens its own connection:
    one inherited through fork must not be used."""
    try:
        with SessionStore(db, readonly=True) as store, open(part, "wb") as fh:
            for chunk in _STREAMED[fmt](store, sessions, header=False):
                fh.write(chunk)
        report.send(None)
    except (ChattermError, OSError) as exc:
        report.send(str(exc))


def render_report(exported: Exported, fmt: str, prices: Mapping[str, PriceProfile] | None = None) -> str:
    """The Markdown or HTML report of `exported`."""
    report = build(exported, prices)
    return render_markdown(report) if fmt == "md" else render_html(report)


# Positions in a row of `SessionStore.export_rows`: turn_index, the TURN_FIELDS
# values, the BRANCH_FIELDS values, user_text, reply.
def _turn_fields(kind: str) -> tuple[int, ...]:
    """Positions of the TurnMetrics fields declared with `kind` (a type name)."""
    return tuple(1 + TURN_FIELDS.index(f.name) for f in fields(TurnMetrics) if kind in str(f.type))


_BOOLS = _turn_fields("bool")
"""SQLite keeps booleans as 0/1 (NULL, from an early chatterm: false)."""
_TEXTS = _turn_fields("str")
_STAMP = 1 + TURN_FIELDS.index("submitted_at")
_FLOATS = (*(i for i in _turn_fields("float") if i != _STAMP), 1 + TURN_FIELDS.index("cost_usd"))
"""Written as the JSONL export writes them (`plain_float`): repr gave `9.2e-05` beside `0.000255`."""
_NUMBERS = tuple(i for i in range(1 + len(TURN_FIELDS)) if i not in (*_BOOLS, *_TEXTS, _STAMP))
_INHERITED = 1 + len(TURN_FIELDS) + BRANCH_FIELDS.index("inherited")
_JSONL_KEYS = ROW_FIELDS + TEXT_FIELDS
_BOOL_KEYS = (*(TURN_FIELDS[i - 1] for i in _BOOLS), "inherited")


def _jsonl_chunks(store: SessionStore, sessions: Sequence[SessionInfo], header: bool = True) -> Iterator[bytes]:
    keys = _JSONL_KEYS
    for info in sessions:
        head = (info.id, info.started_at, info.model_identity, info.device)
        lines = []
        for turn in store.export_rows(info.id):
            user_text, reply = turn[-2], turn[-1]
            row = dict(zip(keys, head + turn[:-2] + (len(user_text), len(reply), user_text, reply), strict=True))
            for key in _BOOL_KEYS:
                row[key] = bool(row[key])
            lines.append(json_line(row))
        yield b"".join(lines)


_PLAIN_NUMBERS = {int, float, type(None)}
_numbers_of = operator.itemgetter(*_NUMBERS)


def _csv_turn_cells(turn: tuple) -> list:
    """A turn's CSV cells from `turn_index` to `reply_chars`, as `csv_cell`
    writes them: neutralized text, true/false, ISO 8601 timestamps, empty for
    a missing or non-finite number."""
    cells = list(turn[:-2])
    cells += (len(turn[-2]), len(turn[-1]))
    numbers = _numbers_of(cells)
    if set(map(type, numbers)) <= _PLAIN_NUMBERS and math.inf not in numbers and -math.inf not in numbers:
        # The common row, cheaply: the csv module writes plain finite numbers
        # and None as csv_cell would, and most text needs nothing (100,000 rows
        # of 40 cells each through csv_cell took 4 s).
        for i in _TEXTS:
            value = cells[i]
            if value.__class__ is not str or not csv_keeps(value):
                cells[i] = csv_cell(value)
        for i in (*_BOOLS, _INHERITED):
            cells[i] = "true" if cells[i] else "false"
        for i in _FLOATS:
            value = cells[i]
            if value.__class__ is float and -1e-4 < value < 1e-4 and value:  # where repr writes an exponent
                cells[i] = plain_float(value)
        cells[_STAMP] = csv_cell(iso_utc(cells[_STAMP]))
        return cells
    for i in (*_BOOLS, _INHERITED):
        cells[i] = bool(cells[i])
    cells[_STAMP] = iso_utc(cells[_STAMP])
    return [csv_cell(cell) for cell in cells]


def _csv_chunks(store: SessionStore, sessions: Sequence[SessionInfo], header: bool = True) -> Iterator[bytes]:
    out = io.StringIO()
    # RFC 4180 line ends: the csv module then quotes a cell holding a lone "\r" too.
    writer = csv.writer(out, lineterminator="\r\n")
    if header:
        writer.writerow(ROW_FIELDS)
    for info in sessions:
        head = [csv_cell(v) for v in (info.id, iso_utc(info.started_at), info.model_identity, info.device)]
        writer.writerows(head + _csv_turn_cells(turn) for turn in store.export_rows(info.id))
        yield out.getvalue().encode("utf-8")
        out.seek(0)
        out.truncate()
    if out.tell():
        yield out.getvalue().encode("utf-8")


_STREAMED = {"jsonl": _jsonl_chunks, "csv": _csv_chunks}
"""The formats written a session at a time (`header`: the CSV header row; JSONL has none)."""


# -- files ---------------------------------------------------------------------
def default_export_path(session_id: int, fmt: str) -> Path:
    """Where the TUI's export key writes: the data folder's exports/."""
    return paths.exports_dir() / f"session-{session_id}.{fmt}"


def export_session(
    store: SessionStore,
    session_id: int,
    fmt: str,
    path: Path | None = None,
    prices: Mapping[str, PriceProfile] | None = None,
) -> Path:
    """Write one session to `path` (default: `default_export_path`) and return the path."""
    sessions = sessions_to_export(store, [session_id])
    if path is None:
        path = default_export_path(session_id, fmt)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ChattermError(f"cannot create {path.parent}: {exc.strerror or exc}") from None
    replace_output(Path(path), export_chunks(store, sessions, fmt, prices), database=store.path)
    return Path(path)


# -- helpers -------------------------------------------------------------------
def iso_utc(ts):
    """Unix seconds as ISO 8601 UTC with milliseconds, e.g. 2023-11-14T22:13:21.500Z
    (anything that is not a finite number is returned as it is)."""
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return ts
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
