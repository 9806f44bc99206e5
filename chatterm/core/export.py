"""Export of session latency logs: JSONL, CSV and a Markdown report.

Contract (the field list with units is docs/export-format.md):
- One row per turn. `ROW_FIELDS` is the stable column order shared by JSONL and
  CSV: session fields, `turn_index` (from 1), every `TURN_FIELDS` metric, and
  `user_chars` / `reply_chars`. `engine`, `model_id` and `persona_id` are the
  turn's own values (chatterm keeps them equal to the session's).
- JSONL also carries the texts (`user_text`, `reply`) and is exact: JSON escapes
  control characters, so it is safe to print on a terminal. CSV carries no
  conversation text: it is made for spreadsheets, where untrusted model text
  could run as a formula; a string cell that starts like a formula gets a
  leading `'` for the same reason.
- Markdown is a report per session: session facts, a summary table
  (`SessionSummary.of`) and a per-turn table with short previews of the texts.
  Every string is escaped so that it renders literally and cannot break a table
  (pipes, newlines, markup, HTML, control characters).
- Rendering only reads the store. Writing a file is atomic (a temp file in the
  same folder, then a rename): a failure leaves the old file or nothing.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

from chatterm.core import paths
from chatterm.core.atomic import atomic_write_bytes
from chatterm.core.errors import ChattermError
from chatterm.core.metrics import TURN_FIELDS, SessionSummary
from chatterm.core.store import SessionInfo, SessionStore, TurnRecord

FORMATS = ("jsonl", "csv", "md")

SESSION_FIELDS = ("session_id", "session_started_at", "model_identity", "device")
ROW_FIELDS: tuple[str, ...] = (
    SESSION_FIELDS + ("turn_index",) + TURN_FIELDS + ("user_chars", "reply_chars")
)
"""The CSV columns, and the JSONL keys before `TEXT_FIELDS`."""
TEXT_FIELDS = ("user_text", "reply")
"""JSONL only."""

PREVIEW_CHARS = 48
"""How much of each text the Markdown per-turn table shows."""

Exported = Sequence[tuple[SessionInfo, Sequence[TurnRecord]]]


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
        **{name: metrics[name] for name in TURN_FIELDS},
        "user_chars": len(record.user_text),
        "reply_chars": len(record.reply),
    }
    if texts:
        row["user_text"] = record.user_text
        row["reply"] = record.reply
    return row


def collect(store: SessionStore, session_ids: Iterable[int]) -> list[tuple[SessionInfo, list[TurnRecord]]]:
    """Sessions and their turns, read from the store (unknown id: ChattermError)."""
    return [(store.session(sid), store.turns(sid)) for sid in session_ids]


# -- formats -------------------------------------------------------------------
def render_jsonl(exported: Exported) -> str:
    lines = []
    for info, records in exported:
        for record in records:
            row = {k: _finite(v) for k, v in turn_row(info, record, texts=True).items()}
            line = json.dumps(row, ensure_ascii=False, allow_nan=False)
            # Line separators that JSON leaves raw but many line readers split on.
            for ch in ("\u2028", "\u2029", "\x85"):
                line = line.replace(ch, f"\\u{ord(ch):04x}")
            lines.append(line + "\n")
    return "".join(lines)


def render_csv(exported: Exported) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(ROW_FIELDS)
    for info, records in exported:
        for record in records:
            row = turn_row(info, record, texts=False)
            writer.writerow([_csv_cell(row[name]) for name in ROW_FIELDS])
    return out.getvalue()


def render_markdown(exported: Exported) -> str:
    parts = ["# chatterm latency report\n"]
    if not exported:
        parts.append("\nNo sessions.\n")
    for info, records in exported:
        parts.append(_markdown_session(info, records))
    return "".join(parts)


def render(exported: Exported, fmt: str) -> str:
    if fmt == "jsonl":
        return render_jsonl(exported)
    if fmt == "csv":
        return render_csv(exported)
    if fmt == "md":
        return render_markdown(exported)
    raise ChattermError(f"unknown export format {fmt!r}; use one of: {', '.join(FORMATS)}")


# -- files ---------------------------------------------------------------------
def default_export_path(session_id: int, fmt: str) -> Path:
    """Where the TUI's export key writes: the data folder's exports/."""
    return paths.exports_dir() / f"session-{session_id}.{fmt}"


def export_session(store: SessionStore, session_id: int, fmt: str, path: Path | None = None) -> Path:
    """Write one session to `path` (default: `default_export_path`) and return the path."""
    text = render(collect(store, [session_id]), fmt)
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
def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value  # keep spreadsheets from evaluating it
    return str(value)


_MD_ESCAPED = set("\\`*_[]<>|&~$#!")
_SPOOFING = {0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}


def md_escape(text: str, limit: int | None = None) -> str:
    """`text` as Markdown that renders literally on one line of a table cell.

    Newlines become "↵", control characters their visible Unicode pictures
    (ESC -> "␛"), bidirectional overrides U+FFFD; markup characters are
    backslash-escaped. `limit` shortens the text first (with "…").
    """
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    text = text.replace("\r\n", "\n")
    out = []
    for ch in text:
        code = ord(ch)
        if ch in "\n\r":
            out.append("↵")
        elif ch == "\t":
            out.append(" ")
        elif code < 0x20:
            out.append(chr(0x2400 + code))
        elif code == 0x7F:
            out.append("␡")
        elif 0x80 <= code < 0xA0 or code in _SPOOFING:
            out.append("\ufffd")
        elif ch in _MD_ESCAPED:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str) -> str:
    """A Markdown table; `align` has one of "l"/"r" per column."""
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|")
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines) + "\n"


def _markdown_session(info: SessionInfo, records: Sequence[TurnRecord]) -> str:
    summary = SessionSummary.of(r.metrics for r in records)
    facts = [
        ("Started", _utc(info.started_at)),
        ("Model", md_escape(info.model_id)),
        ("Model identity", md_escape(info.model_identity)),
        ("Engine", md_escape(info.engine)),
        ("Device", md_escape(info.device)),
        ("Persona", md_escape(info.persona_id)),
    ]
    totals = [
        ("Turns", str(summary.turns)),
        ("TTFT p50 / p95 / max (ms)", " / ".join(
            _num(v) for v in (summary.ttft_p50_ms, summary.ttft_p95_ms, summary.ttft_max_ms)
        )),
        ("Mean decode rate (tok/s)", _num(summary.mean_decode_tok_s)),
        ("Prompt tokens (cached / prefilled)",
         f"{summary.prompt_tokens} ({summary.cached_tokens} / {summary.prefilled_tokens})"),
        ("Generated tokens", str(summary.generated_tokens)),
        ("Cost (USD, API-equivalent)", f"{summary.cost_usd:.6f}"),
        ("Cache savings: prefill time (s)", f"{summary.saved_prefill_s:.3f}"),
        ("Cache savings: cost (USD)", f"{summary.saved_usd:.6f}"),
    ]
    if summary.energy_wh is not None:
        totals.append(("GPU energy (Wh)", f"{summary.energy_wh:.4f}"))
    turn_rows = []
    notes = []
    for r in records:
        m = r.metrics
        turn_rows.append([
            str(r.index),
            _num(m.ttft_ms),
            _num(m.restore_ms),
            _num(m.prefill_ms),
            _num(m.decode_tok_s),
            str(m.prompt_tokens),
            str(m.cached_tokens),
            str(m.prefilled_tokens),
            str(m.generated_tokens),
            md_escape(m.cache_outcome or ""),
            md_escape(m.stop_reason or ""),
            f"{m.cost_usd:.6f}",
            md_escape(r.user_text, PREVIEW_CHARS),
            md_escape(r.reply, PREVIEW_CHARS),
        ])
        if m.error:
            notes.append(f"- Turn {r.index}: error: {md_escape(m.error)}")
        if m.cache_detail:
            notes.append(f"- Turn {r.index}: cache: {md_escape(m.cache_detail)}")
        if m.dropped_turns:
            plural = "s" if m.dropped_turns != 1 else ""
            notes.append(
                f"- Turn {r.index}: {m.dropped_turns} oldest turn{plural} dropped to fit the context"
            )
    parts = [
        f"\n## Session {info.id}\n\n",
        _table(["Session", ""], facts, "ll"),
        "\n### Summary\n\n",
        _table(["Metric", "Value"], totals, "lr"),
        "\n### Turns\n\n",
    ]
    if turn_rows:
        parts.append(_table(
            ["#", "TTFT ms", "restore ms", "prefill ms", "decode tok/s", "prompt", "cached",
             "prefilled", "generated", "cache", "stop", "cost USD", "user", "reply"],
            turn_rows,
            "rrrrrrrrrllrll",
        ))
    else:
        parts.append("No turns.\n")
    if notes:
        parts.append("\n" + "\n".join(notes) + "\n")
    return "".join(parts)
