"""Export of session latency logs: JSONL, CSV, a Markdown report and an HTML report.

Contract (the field list with units is docs/export-format.md):
- One row per turn. `ROW_FIELDS` is the stable column order shared by JSONL and
  CSV: session fields, `turn_index` (from 1), every `TURN_FIELDS` metric, and
  `user_chars` / `reply_chars`. `engine`, `model_id` and `persona_id` are the
  turn's own values (chatterm keeps them equal to the session's).
- JSONL also carries the texts (`user_text`, `reply`) and is exact: JSON escapes
  control characters, so it is safe to print on a terminal; timestamps (`_at`)
  are Unix seconds. CSV carries no conversation text: it is made for
  spreadsheets, so timestamps are ISO 8601 UTC and text cells that start like a
  formula are neutralized (`chatterm.core.inert.csv_cell`).
- `md` and `html` are reports over one or several sessions (`chatterm.core.report`
  computes, `md_report` / `html_report` format): charts, per-turn timelines and
  per-token costs, the cost split and a what-if under every price profile given
  in `prices` (the catalog's). Every string is escaped for its format.
- `collect` refuses a session without turns (nothing to report: ChattermError)
  unless asked to skip such sessions (`--all`).
- Rendering only reads the store. Writing a file is atomic (a temp file in the
  same folder, then a rename): a failure leaves the old file or nothing.
"""

from __future__ import annotations

import csv
import io
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Mapping

import orjson

from chatterm.core import paths
from chatterm.core.atomic import atomic_write_bytes
from chatterm.core.errors import ChattermError
from chatterm.core.html_report import render_html
from chatterm.core.inert import BIDI_CONTROLS, csv_cell
from chatterm.core.md_report import render_markdown
from chatterm.core.metrics import TURN_FIELDS
from chatterm.core.models import PriceProfile
from chatterm.core.report import Exported, build
from chatterm.core.store import SessionInfo, SessionStore, TurnRecord

FORMATS = ("jsonl", "csv", "md", "html")
REPORT_FORMATS = ("md", "html")
"""Formats that chart and compare sessions (and use price profiles)."""

SESSION_FIELDS = ("session_id", "session_started_at", "model_identity", "device")
ROW_FIELDS: tuple[str, ...] = (
    SESSION_FIELDS + ("turn_index",) + TURN_FIELDS + ("user_chars", "reply_chars")
)
"""The CSV columns, and the JSONL keys before `TEXT_FIELDS`."""
TEXT_FIELDS = ("user_text", "reply")
"""JSONL only."""

# What JSON leaves raw but must not reach a terminal or a line reader as is: DEL
# and C1 controls (0x9b is an 8-bit CSI some terminals obey), line separators
# many readers split on, and bidi controls that reorder the text around them.
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029" + "".join(chr(c) for c in sorted(BIDI_CONTROLS)) + "]")

TIMESTAMP_FIELDS = ("session_started_at", "submitted_at")
"""Unix seconds in JSONL, ISO 8601 UTC in CSV."""


# -- rows ----------------------------------------------------------------------
def turn_row(info: SessionInfo, record: TurnRecord, *, texts: bool) -> dict:
    """The flat export row of one turn (`ROW_FIELDS`, plus `TEXT_FIELDS` if asked)."""
    metrics = record.metrics.to_dict()
    row = {
        "session_id": info.id,
        "session_started_at": info.started_at,
        "model_identity": info.model_identity,
        "device": info.device,
        "turn_index": record.index,
        **metrics,  # to_dict() has exactly TURN_FIELDS, in that order
        "user_chars": len(record.user_text),
        "reply_chars": len(record.reply),
    }
    if texts:
        row["user_text"] = record.user_text
        row["reply"] = record.reply
    return row


def collect(
    store: SessionStore,
    session_ids: Iterable[int],
    *,
    skip_empty: bool = False,
    infos: Mapping[int, SessionInfo] | None = None,
) -> list[tuple[SessionInfo, list[TurnRecord]]]:
    """Sessions and their turns, read from the store (`infos`: the sessions'
    infos, already read). An unknown id, or a session without turns (unless
    `skip_empty`: then it is left out), is a ChattermError."""
    exported = []
    for sid in session_ids:
        info = infos[sid] if infos is not None and sid in infos else store.session(sid)
        records = store.turns(sid)
        if not records:
            if skip_empty:
                continue
            raise ChattermError(f"session {sid} has no turns to export")
        exported.append((info, records))
    return exported


# -- formats -------------------------------------------------------------------
def render_jsonl(exported: Exported) -> str:
    # orjson writes compact UTF-8, escapes C0 controls, " and \ as JSON requires,
    # and writes NaN and infinities as null (JSON has none), as documented.
    lines = []
    for info, records in exported:
        for record in records:
            line = orjson.dumps(turn_row(info, record, texts=True)).decode()
            # isascii is a fast C scan; DEL is the one ASCII character to escape.
            if (not line.isascii() or "\x7f" in line) and _JSON_RAW.search(line):
                line = _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", line)
            lines.append(line + "\n")
    return "".join(lines)


def render_csv(exported: Exported) -> str:
    out = io.StringIO()
    # RFC 4180 line ends: the csv module then quotes a cell holding a lone "\r" too.
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(ROW_FIELDS)
    for info, records in exported:
        for record in records:
            row = turn_row(info, record, texts=False)
            for name in TIMESTAMP_FIELDS:
                row[name] = iso_utc(row[name])
            writer.writerow([csv_cell(row[name]) for name in ROW_FIELDS])
    return out.getvalue()


def render(exported: Exported, fmt: str, prices: Mapping[str, PriceProfile] | None = None) -> str:
    """`exported` in format `fmt`; `prices` feed the reports' what-if tables."""
    if fmt == "jsonl":
        return render_jsonl(exported)
    if fmt == "csv":
        return render_csv(exported)
    if fmt == "md":
        return render_markdown(build(exported, prices))
    if fmt == "html":
        return render_html(build(exported, prices))
    raise ChattermError(f"unknown export format {fmt!r}; use one of: {', '.join(FORMATS)}")


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
    text = render(collect(store, [session_id]), fmt, prices)
    if path is None:
        path = default_export_path(session_id, fmt)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ChattermError(f"cannot create {path.parent}: {exc.strerror or exc}") from None
    write_atomic(Path(path), text)
    return Path(path)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) all at once, or raise ChattermError and
    leave nothing behind. A new file is private (0600): it holds conversations;
    an existing file keeps its mode."""
    try:
        mode = path.stat().st_mode & 0o777 if path.is_file() else 0o600
        atomic_write_bytes(path, text.encode("utf-8"), mode)
    except OSError as exc:
        raise ChattermError(f"cannot write {path}: {exc.strerror or exc}") from None


# -- helpers -------------------------------------------------------------------
def iso_utc(ts):
    """Unix seconds as ISO 8601 UTC with milliseconds, e.g. 2023-11-14T22:13:21.500Z
    (anything that is not a finite number is returned as it is)."""
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return ts
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
