"""Full-text search over user messages and replies.

Contract:
- `search(query, text, limit, fts=, parent=, skip=)` returns the newest
  matching turns first, at most `limit`, as (session_id, turn_index,
  user_text, reply, parent) rows, `parent` being the SQL (over `t`) of the
  turn's parent; turns for which the SQL `skip` is true are left out. Every
  word of `text` must occur (in the user message or the reply); the last word
  may be the start of a word, so a search typed letter by letter finds as it
  goes.
- With FTS5 (`fts`: the database has the `turns_fts` index) words match as
  the index tokenizes them (Unicode letters and digits, case and diacritics
  ignored). Each word is quoted, so FTS syntax in `text` (quotes, `*`, `-`,
  `NEAR`, `AND`, parentheses, column filters) is searched for, never parsed:
  nothing a user types raises. A word with no letter or digit cannot be in
  the index: a query made only of such words is a plain scan.
- Without FTS5 (or for such words) the scan is SQL LIKE over both texts, with
  `%`, `_` and `\\` escaped: case is ignored for ASCII letters only.
- `holds_every_word(body, text)`: `body` alone holds every word of `text` as
  the index matches them (whole words, the last as a prefix, folded).
- `snippet(user_text, reply, text)` says where the match is and gives plain
  text around it, on one line: where a word of `text` begins, compared as the
  index does (case and diacritics ignored), before a match inside a word.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Callable

from chatterm.core.store.records import one_line
from chatterm.core.store.schema import FTS_TABLE

Query = Callable[[str, tuple], list[tuple]]
SNIPPET_CHARS = 90
SNIPPET_LEAD = 12
"""Characters kept before a match that is further in than twice this: the
sessions screen's 36-character cell still shows the match after its "you: …"
(a third of 90 hid it)."""


def _indexable(word: str) -> bool:
    return any(c.isalnum() for c in word)


def fts_expression(words: list[str]) -> str:
    """An FTS5 MATCH expression requiring every word, the last as a prefix."""
    quoted = ['"' + w.replace('"', '""') + '"' for w in words]
    quoted[-1] += " *"
    return " ".join(quoted)


def _like(word: str) -> str:
    escaped = word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def search(query: Query, text: str, limit: int, *, fts: bool, parent: str, skip: str = "0") -> list[tuple]:
    words = text.split()
    if not words or limit <= 0:
        return []
    columns = f"t.session_id, t.turn_index, t.user_text, t.reply, {parent}"
    if fts and all(_indexable(w) for w in words):
        return query(
            f"SELECT {columns} FROM {FTS_TABLE} f JOIN turns t ON t.id = f.rowid "
            f"WHERE {FTS_TABLE} MATCH ? AND NOT {skip} ORDER BY f.rowid DESC LIMIT ?",
            (fts_expression(words), limit),
        )
    where = " AND ".join(
        "(t.user_text LIKE ? ESCAPE '\\' OR t.reply LIKE ? ESCAPE '\\')" for _ in words
    )
    params = tuple(p for w in words for p in (_like(w), _like(w)))
    return query(
        f"SELECT {columns} FROM turns t WHERE {where} AND NOT {skip} ORDER BY t.id DESC LIMIT ?", (*params, limit)
    )


def _fold(text: str) -> str:
    """`text` casefolded and without diacritics, one character for each of
    its characters (so a position in it is a position in `text`): what the
    FTS5 tokenizer compares, "Café" and "cafe" alike."""
    if text.isascii():
        return text.lower()  # the common case, at C speed
    return "".join(map(_fold_char, text))


@functools.lru_cache(maxsize=4096)
def _fold_char(c: str) -> str:
    base = unicodedata.normalize("NFKD", c)[:1] or c
    return base.casefold()[:1] or c


def holds_every_word(body: str, text: str) -> bool:
    """Whether `body` holds every word of `text` as the index matches them:
    whole words, the last one as the start of a word (search as you type),
    case and diacritics ignored. ("cat" is not in "concatenate".)"""
    folded = _fold(body)
    words = text.split()
    starts, ends = r"(?<![^\W_])", r"(?![^\W_])"  # no letter or digit before (after) it
    return all(
        re.search(starts + re.escape(_fold(word)) + ("" if n == len(words) - 1 else ends), folded)
        for n, word in enumerate(words)
    )


def snippet(user_text: str, reply: str, text: str) -> tuple[str, str]:
    """("user" or "assistant", plain text around the first word of `text`
    found): a word that begins there first (the index matched that one, not
    "art" inside "start"), in the user's text, then the reply."""
    any_word = "|".join(re.escape(_fold(w)) for w in text.split())
    # A word that begins at the match (no letter or digit before it), then anywhere.
    patterns = [re.compile(rf"(?<![^\W_])(?:{any_word})"), re.compile(any_word)]
    bodies = [("user", user_text, _fold(user_text)), ("assistant", reply, _fold(reply))]
    for pattern in patterns:
        for role, body, folded in bodies:
            match = pattern.search(folded)
            if match:
                lead = match.start()
                start = 0 if lead <= 2 * SNIPPET_LEAD else lead - SNIPPET_LEAD
                if start and not body[start - 1].isspace():  # from the start of a word
                    space = body.find(" ", start, lead)
                    start = space + 1 if space >= 0 else start
                cut = one_line(body[start:], SNIPPET_CHARS)
                return role, ("…" + cut if start else cut)
    # Matched through the tokenizer some other way: the message's start.
    return "user", one_line(user_text, SNIPPET_CHARS)
