"""A model row's facts as short texts, the same in `chatterm models` and the
model picker. Texts that come from files (names, paths, reasons) are passed
through `one_line`: a GGUF's or a folder's name is untrusted, and a newline
in one would split a row of the table that grep and awk read.

`COLUMNS` / `cells` are the CLI table's; the picker, a dialog in a terminal
often 120 columns wide, shows `PICKER_COLUMNS` / `picker_cells` (the same
texts, "fits" as one word) and the rest for the highlighted row in one line
(`picker_detail`: the fit in full, the chat template, where it was found)."""

from __future__ import annotations

from chatterm.core.discovery.fit import Memory
from chatterm.core.discovery.listing import ModelRow
from chatterm.core.metrics.format import home_short
from chatterm.core.report.escape import one_line

COLUMNS = ("id", "arch", "params", "quant", "size", "trained ctx", "template", "KV/token", "fits", "found in")


def fmt_count(n: int) -> str:
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            # Three figures; 1000-1023 of a unit whole (.3g writes 1e+03).
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{n} B"


def memory_label(memory: Memory) -> str:
    return f"{fmt_bytes(memory.available_bytes)} {memory.kind} free"


def fits_word(row: ModelRow) -> str:
    if not row.usable:
        return "unusable"
    return "no" if row.n_ctx is None else "yes"


def _fit_detail(row: ModelRow) -> str:
    if row.n_ctx is None:
        return f"needs {fmt_bytes(row.needed_bytes)}"
    return f"n_ctx {row.n_ctx:,}, {fmt_bytes(row.needed_bytes)}"


def fits_text(row: ModelRow) -> str:
    word = fits_word(row)
    return word if not row.usable else f"{word}: {_fit_detail(row)}"


def where(row: ModelRow) -> str:
    """Where the model was found, the home folder written as ~."""
    return one_line(home_short(row.found.location))


def problem_text(row: ModelRow) -> str:
    """Why the model cannot be used, and where it was found unless the reason
    names that already (a models.toml entry's error names its file)."""
    problem = row.problem or ""
    return problem if str(row.found.location) in problem else f"{problem} ({where(row)})"


def kv_text(row: ModelRow) -> str:
    """KV/token, with the KV type when it is not f16."""
    kv = row.kv_bytes_per_token
    if kv is None:
        return "?"
    return f"{kv:,} B" if row.found.kv_type == "f16" else f"{kv:,} B {row.found.kv_type}"


def cells(row: ModelRow) -> tuple[str, ...]:
    """One text per `COLUMNS` entry."""
    found_in = where(row)
    if row.facts is None:
        return (one_line(row.id), "–", "–", "–", "–", "–", "–", "–", fits_text(row), found_in)
    f = row.facts
    return (
        one_line(row.id),
        one_line(f.architecture),
        fmt_count(f.parameters),
        one_line(f.quantization),
        fmt_bytes(f.file_size),
        "?" if f.context_length is None else f"{f.context_length:,}",
        "yes" if f.has_chat_template else "no",
        kv_text(row),
        fits_text(row),
        found_in,
    )


PICKER_COLUMNS = ("id", "fits", "size", "quant", "params", "trained ctx", "KV/token", "arch")
"""What decides a choice first: at 80 columns the table scrolls sideways
after "trained ctx", and "fits" at the end was out of view."""


def picker_cells(row: ModelRow) -> tuple[str, ...]:
    """One text per `PICKER_COLUMNS` entry."""
    texts = dict(zip(COLUMNS, cells(row), strict=True)) | {"fits": fits_word(row)}
    return tuple(texts[c] for c in PICKER_COLUMNS)


def picker_detail(row: ModelRow) -> str:
    """What the picker's columns leave out, for the highlighted usable model."""
    if row.facts is None:
        template = "?"
    else:
        template = "yes" if row.facts.has_chat_template else "none (set chat_template in models.toml)"
    fit = "does not fit" if row.n_ctx is None else "fits"
    return f"{fit}: {_fit_detail(row)} · chat template: {template} · found in {where(row)}"
