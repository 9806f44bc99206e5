"""Hostile text through every export format stays inert (hypothesis properties).

Generated strings mix control characters, bidi overrides, ANSI and OSC escape
sequences, Rich markup, HTML, Markdown table syntax and spreadsheet formula
prefixes, and go into every text field a session carries: persona and model
ids, device, model identity, error message, cache detail, price profile, stop
reason and both conversation texts. Each example is stored in a real SQLite
database and exported in every format. `max_examples` keeps CI bounded; set
HYPOTHESIS_EXAMPLES for a longer run.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sqlite3
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatterm.core.metrics.turn_metrics import TurnMetrics
from chatterm.core.report.escape import BIDI_CONTROLS, FORMULA_STARTS, json_document, literal_lines, one_line
from chatterm.core.report.export import ROW_FIELDS
from chatterm.core.store.session_store import SessionStore
from tests.conftest import export_text
from tests.core.report.test_export import PRICES

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "200"))

PIECES = [
    "\x1b[31m", "\x1b[0m", "\x1b]8;;http://evil.example\x1b\\", "\x07", "\x00", "\x9b", "\x7f",
    "\u202e", "\u2066", "\u200f", "\u061c", "\u2028", "\x85", "\r\n", "\n", "\r", "\t",
    "[bold]", "[/]", "[link=http://x]", "[@click=app.quit]", "$x$",
    "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "&amp;", '"', "'", "`", "|", "\\|",
    "=", "+", "-", "@", "=HYPERLINK(\"http://x\")", "-2+3", "+1", "@SUM(A1)", "-1.5",
    "**", "_", "#", "![x](http://x)", "```", "www.evil.example", "https://evil.example/a",
]
hostile = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=8).map("".join)

TEXT_COLUMNS = ("model_identity", "device", "engine", "model_id", "persona_id", "price_profile",
                "cache_outcome", "cache_detail", "stop_reason", "error")
_ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "ul", "li",
                 "div", "span", "section", "table", "thead", "tbody", "tr", "th", "td",
                 "svg", "g", "rect", "line", "polyline", "circle", "text"}
_MD_BLOCK = re.compile(r"^(`{3,})text\n(.*?)\n\1$", re.M | re.S)
"""A message's fenced block in the Markdown report: it ends at its own fence only."""
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _store(db: Path, t: dict) -> int:
    with SessionStore(db) as store:
        sid = store.create_session(
            model_id=t["model_id"], model_identity=t["identity"], engine=t["engine"],
            device=t["device"], persona_id=t["persona_id"], started_at=1_700_000_000.0,
        )
        store.record_turn(sid, t["user"], t["reply"], TurnMetrics(
            engine=t["engine"], model_id=t["model_id"], persona_id=t["persona_id"],
            submitted_at=1_700_000_001.0, price_profile=t["profile"], cache_outcome=t["outcome"],
            cache_detail=t["detail"], prefill_ms=50.0, prompt_tokens=40, cached_tokens=10,
            prefilled_tokens=30, generated_tokens=5, ttft_ms=60.0, decode_ms=40.0, total_ms=100.0,
            stop_reason=t["stop"], error=t["error"], cost_input_usd=0.00006,
        ))
    return sid


fields = st.fixed_dictionaries({
    k: hostile for k in ("model_id", "identity", "engine", "device", "persona_id", "user", "reply",
                         "profile", "outcome", "detail", "stop", "error")
})


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _md_cells(line: str) -> list[str]:
    return re.split(r"(?<!\\)\|", line.strip())[1:-1]


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """One real database for all examples (each adds its own session): fast enough for CI."""
    return tmp_path_factory.mktemp("inert") / "chatterm.db"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=fields)
def test_hostile_text_stays_inert_in_every_format(db, t):
    sid = _store(db, t)
    with SessionStore(db, readonly=True) as store:
        stored, info = store.turns(sid)[0], store.session(sid)
        out = {fmt: export_text(store, [sid], fmt, PRICES) for fmt in ("jsonl", "csv", "md", "html")}

    # JSONL: exact round trip, nothing a terminal would obey.
    row = json.loads(out["jsonl"])
    assert row["reply"] == stored.reply and row["error"] == stored.metrics.error
    assert row["persona_id"] == stored.metrics.persona_id
    assert not _UNSAFE.search(out["jsonl"].rstrip("\n"))

    # CSV: the csv module reads back every cell; formula-like text is neutralized,
    # numbers are not.
    rows = list(csv.reader(io.StringIO(out["csv"], newline="")))
    assert len(rows) == 2 and rows[0] == list(ROW_FIELDS)
    cells = dict(zip(rows[0], rows[1], strict=False))
    turn = {**stored.metrics.to_dict(), "model_identity": info.model_identity,
            "device": info.device}
    for name in TEXT_COLUMNS:
        value = literal_lines(turn[name] or "")  # CSV goes to a terminal by default
        expected = value
        if value.startswith(FORMULA_STARTS):
            try:
                float(value)
                numeric = value == value.strip()
            except ValueError:
                numeric = False
            if not numeric:
                expected = "'" + value
        assert cells[name] == expected, name
    for cell in rows[1]:
        if cell.startswith(FORMULA_STARTS):
            float(cell)  # only plain numbers may start like a formula
    assert float(cells["prefill_ms"]) == 50.0
    assert not _UNSAFE.search(out["csv"].replace("\r\n", "")) and not any(ord(ch) in BIDI_CONTROLS for ch in out["csv"])

    # Markdown: the messages are whole, each in a code block nothing in it closes;
    # outside them tables keep their shape; no raw control, bidi or HTML from the input.
    md = out["md"]
    assert not _UNSAFE.search(md.replace("\n", ""))
    assert not any(ord(ch) in BIDI_CONTROLS for ch in md)
    messages = [stored.user_text] + ([stored.reply] if stored.reply else [])
    assert [body for _, body in _MD_BLOCK.findall(md)] == [literal_lines(m) for m in messages]
    md = _MD_BLOCK.sub("", md)
    assert not re.search(r"(?<!\\)<", md)
    # No bare URL for GFM to make a link of (the report's own text has none).
    assert not re.search(r"(?<!\\)://|www\.", md, re.IGNORECASE)
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            width = len(_md_cells(line))
            block = []
            for following in lines[i:]:
                if not following.startswith("|"):
                    break
                block.append(following)
            assert all(len(_md_cells(r)) == width for r in block), block
    assert md.count("```mermaid") == 3

    # HTML: parses, only the report's own elements, no handlers, text shown literally.
    html_text = out["html"]
    parser = _Collect()
    parser.feed(html_text)
    parser.close()
    assert {tag for tag, _ in parser.tags} <= _ALLOWED_TAGS
    assert not [a for _, attrs in parser.tags for a in attrs if a.startswith("on")]
    assert not any(ord(ch) in BIDI_CONTROLS for ch in html_text)
    assert not _UNSAFE.search(html_text.replace("\n", ""))
    text = "".join(parser.text)
    for value in (stored.metrics.persona_id, stored.metrics.error or "", stored.metrics.cache_detail):
        assert one_line(value) in text


def test_a_crafted_database_cannot_smuggle_formulas_into_numeric_columns(tmp_path):
    """SQLite keeps whatever a column is given: a database edited by hand (or by
    anything else) may hold text or infinities where chatterm writes numbers.
    CSV still neutralizes the text and blanks the infinities; JSONL stays exact."""
    db = tmp_path / "chatterm.db"
    with SessionStore(db) as store:
        sid = store.create_session(model_id="m", model_identity="x", engine="local", device="CPU",
                                   persona_id="assistant")
        for _ in range(2):
            store.record_turn(sid, "q\x00uestion", "a\x00\x00b", TurnMetrics(
                engine="local", model_id="m", persona_id="assistant", submitted_at=1_700_000_001.0,
                prefill_ms=5.0, decode_ms=7.0, stop_reason="eos"))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE turns SET prefill_ms = '=HYPERLINK(\"http://x\")', decode_ms = 9e999, "
                     "tokens_estimated = 1, cache_detail = X'00ff' WHERE turn_index = 1")
    with SessionStore(db, readonly=True) as store:
        rows = list(csv.DictReader(io.StringIO(export_text(store, [sid], "csv"), newline="")))
        jsonl = [json.loads(line) for line in export_text(store, [sid], "jsonl").splitlines()]
    crafted, plain = rows
    assert crafted["prefill_ms"] == "'=HYPERLINK(\"http://x\")" and crafted["decode_ms"] == ""
    assert crafted["tokens_estimated"] == "true" and plain["tokens_estimated"] == "false"
    assert plain["prefill_ms"] == "5.0" and plain["decode_ms"] == "7.0"
    assert crafted["submitted_at"] == plain["submitted_at"] == "2023-11-14T22:13:21.000Z"
    assert jsonl[0]["prefill_ms"] == '=HYPERLINK("http://x")' and jsonl[0]["tokens_estimated"] is True
    assert jsonl[0]["cache_detail"] == "00ff" and crafted["cache_detail"] == "b'\\x00\\xff'"  # a BLOB
    assert jsonl[1]["tokens_estimated"] is False
    # SQLite's length() stops at a NUL: the character counts are still the texts' own.
    assert [r["user_chars"] for r in rows] == ["9", "9"] and [r["reply_chars"] for r in rows] == ["4", "4"]
    assert jsonl[0]["user_chars"] == 9 and jsonl[0]["reply"] == "a\x00\x00b"


def test_json_output_is_inert_and_writes_small_floats_plainly():
    """What `ask --json` and `models --json` print: read in a terminal, so no
    control reaches it; a cost reads `0.000014`, as the JSONL export writes it."""
    value = {"reply": "\x1b[31mred\x9b2J\u202eevil\u2028", "cost_usd": 1.4e-05, "nan": float("nan")}
    text = json_document(value).decode("utf-8")
    assert all(ch == "\n" or ch.isprintable() for ch in text), repr(text)
    assert '"cost_usd": 0.000014' in text and '"nan": null' in text
    assert json.loads(text) == {**value, "nan": None}
