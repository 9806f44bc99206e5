"""Untrusted text made inert for each export format.

Contract (every string that reaches an export goes through one of these):
- `one_line(text, limit)`: newlines become "↵", tab a space, C0/C1 control
  characters their visible Unicode pictures (ESC -> "␛") or U+FFFD, and
  bidirectional controls (overrides, embeddings, isolates, marks) U+FFFD, so text
  can neither restyle a terminal, split a line, nor reorder what surrounds it.
  `limit` shortens first (with "…").
- `md_escape`: `one_line`, then Markdown markup characters backslash-escaped
  (pipes included), so a table cell renders literally and stays one cell; the
  ':' of "https://" and the dot of "www." too, so GFM makes no link of a bare URL. (An e-mail
  address cannot be kept from GFM's mailto: autolink by any escape.)
- `literal_lines(text)`: `one_line` line by line, the line breaks kept as
  "\n": a whole message, inert, its lines where they were.
- `md_block(text)`: `literal_lines` in a fenced code block whose fence is
  longer than any run of backticks in the text, so nothing in it closes the
  block or renders as markup.
- `html_text`: `one_line`, then `html.escape` (quotes too): safe in element text
  and in attribute values. `html_lines`: the same over `literal_lines`, for
  an element that keeps line breaks (`white-space: pre-wrap`).
- `json_line`: a value as one exact JSON line (JSONL) that is safe to print:
  JSON's own escapes, plus DEL, C1 controls, line separators and bidi controls
  as `\\uXXXX`; NaN and infinities are null, bytes hex.
  `json_document`: the same, indented, for a command's `--json` output.
- `csv_cell`: a value as a CSV cell. Numbers stay numbers (a negative number is a
  number, never prefixed); text is `literal_lines` (CSV goes to stdout by
  default: no escape sequence reaches the terminal); a text cell that starts like a spreadsheet formula
  (`=`, `+`, `-`, `@`, tab, carriage return) gets a leading `'`, the
  neutralization spreadsheets expect, unless the whole text is a plain number.
"""

from __future__ import annotations

import html
import math
import re

import orjson

_MD_ESCAPED = set("\\`*_[]<>|&~$#!")
_AUTOLINK = re.compile(r"(?<=www)\.|:(?=/)", re.IGNORECASE)
"""Where GFM would make a bare URL a link: the ':' of "https://" and the dot
of "www.", escaped ("https\\://" stays text; "12:30" is left as it is)."""
BIDI_CONTROLS = frozenset(
    {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
)
"""Characters that change the display order of the text around them."""
_LINE_BREAKS = {"\n", "\r", "\v", "\f", "\x85", "\u2028", "\u2029"}
_LINE_SPLIT = re.compile("[" + "".join(sorted(_LINE_BREAKS)) + "]")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# What JSON leaves raw but must not reach a terminal or a line reader as is: DEL
# and C1 controls (0x9b is an 8-bit CSI some terminals obey), line separators
# many readers split on, and bidi controls that reorder the text around them.
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029" + "".join(chr(c) for c in sorted(BIDI_CONTROLS)) + "]")


def one_line(text: str, limit: int | None = None) -> str:
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    text = text.replace("\r\n", "\n")
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _LINE_BREAKS:
            out.append("↵")
        elif ch == "\t":
            out.append(" ")
        elif code < 0x20:
            out.append(chr(0x2400 + code))
        elif code == 0x7F:
            out.append("␡")
        elif 0x80 <= code < 0xA0 or code in BIDI_CONTROLS:
            out.append("\ufffd")
        else:
            out.append(ch)
    return "".join(out)


def literal_lines(text: str) -> str:
    text = text.replace("\r\n", "\n")
    return "\n".join(one_line(line) for line in _LINE_SPLIT.split(text))


def md_block(text: str) -> str:
    """`text` as a fenced Markdown code block (newline-terminated) that renders it literally."""
    fence = "`" * max(3, max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence}text\n{literal_lines(text)}\n{fence}\n"


def md_escape(text: str, limit: int | None = None) -> str:
    """`text` as Markdown that renders literally on one line of a table cell."""
    escaped = "".join("\\" + ch if ch in _MD_ESCAPED else ch for ch in one_line(text, limit))
    return _AUTOLINK.sub(lambda m: "\\" + m.group(), escaped)


def html_text(text: str, limit: int | None = None) -> str:
    """`text` as inert HTML text (also safe inside a quoted attribute)."""
    return html.escape(one_line(text, limit), quote=True)


def html_lines(text: str) -> str:
    """`text` as inert HTML text with its line breaks kept."""
    return html.escape(literal_lines(text), quote=True)


def _is_number(text: str) -> bool:
    if text != text.strip():
        return False  # float() would accept "\t5"; a spreadsheet might not read it as a number
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


_CSV_CHANGED = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029" + "".join(chr(c) for c in sorted(BIDI_CONTROLS)) + "]"
)


def csv_keeps(text: str) -> bool:
    """Whether `csv_cell` leaves the text `text` as it is (a fast path for exports)."""
    return not text.startswith(FORMULA_STARTS) and _CSV_CHANGED.search(text) is None


def plain_float(value: float) -> str:
    """A finite float as the JSONL export writes it (orjson): `0.000092`, not
    repr's `9.2e-05`, so a CSV column of costs reads alike (an exponent only
    below 1e-5, as in JSONL)."""
    return orjson.dumps(value).decode()


def csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return plain_float(value) if math.isfinite(value) else ""
    if isinstance(value, int):
        return str(value)
    text = literal_lines(str(value))  # read in a terminal too (stdout): no escape sequence stays live
    if text.startswith(FORMULA_STARTS) and not _is_number(text):
        return "'" + text  # keep spreadsheets from evaluating it
    return text


def json_line(value) -> bytes:
    """`value` as one line of JSON, newline included (see the contract)."""
    return _safe_json(value, orjson.OPT_APPEND_NEWLINE)


def json_document(value) -> bytes:
    """`value` as indented JSON in UTF-8, newline included, escaped as
    `json_line` escapes it: what a command's `--json` writes to stdout's bytes
    (JSON is UTF-8 whatever the locale; floats as `0.000014`, not `1.4e-05`)."""
    return _safe_json(value, orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def _safe_json(value, option: int) -> bytes:
    # orjson writes UTF-8, escapes C0 controls, " and \ as JSON requires,
    # and writes NaN and infinities as null (JSON has none).
    try:
        line = orjson.dumps(value, default=_plain, option=option)
    except TypeError:  # a lone surrogate (a file name that is not UTF-8), an int past 64 bits
        line = orjson.dumps(_utf8(value), default=_plain, option=option)
    # isascii is a fast C scan; DEL is the one ASCII character to escape.
    if not line.isascii() or b"\x7f" in line:
        text = line.decode()
        if _JSON_RAW.search(text):
            line = _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode()
    return line


_SURROGATE = re.compile("[\ud800-\udfff]")


def _byte_or_replacement(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "\ufffd"


def _utf8(value: object) -> object:
    """`value` with each text's undecodable bytes (Python's lone surrogates
    for them) written as `\\xff`, as `repr` of the bytes would, another lone
    surrogate as U+FFFD, and an integer past 64 bits as its digits in a string."""
    if isinstance(value, str):
        return _SURROGATE.sub(_byte_or_replacement, value)
    if isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < 1 << 64:
        return str(value)  # orjson's integers end at 64 bits; json.dumps wrote any
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_utf8(v) for v in value]
    return value


def _plain(value: object) -> str:
    """JSON for what SQLite can hold but chatterm never writes (a BLOB in an
    edited database): hex for bytes, text for anything else."""
    return value.hex() if isinstance(value, bytes) else str(value)
