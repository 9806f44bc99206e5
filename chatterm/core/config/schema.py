"""Typed TOML tables: a dataclass is the one description of a table.

Contract:
- A config dataclass declares each TOML key as a field made with `key(...)`:
  its default (the only place that default is written), the check its value
  must pass, and optionally the TOML name when it differs from the field's.
  The field's docstring documents it.
- `from_table(cls, raw, path=, where=, fixed=)` builds the dataclass from a
  parsed table: present keys are checked and converted, absent ones take the
  default, an unknown key or a bad value is a one-line `ChattermError` naming
  the file, the table and the key (`models.toml: [models.x] n_ctx 12 must be an
  integer >= 256`). `fixed` fills fields that do not come from the table.
- Why not pydantic: its import alone costs a noticeable part of the app's
  start-up, and every message here must be one line in the project's words.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import MISSING, Field, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from chatterm.errors import ChattermError

Check = Callable[[Any], Any]
"""Returns the value to store, or raises ValueError("must be ..."). A config
dataclass as the check reads the key as a nested table of that shape."""

T = TypeVar("T")


@dataclass(frozen=True)
class _Key:
    check: Check
    toml: str | None = None


def key(default: Any = MISSING, *, check: Check, toml: str | None = None,
        default_factory: Any = MISSING) -> Any:
    """A dataclass field read from a TOML key (see the module contract)."""
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={"config": _Key(check, toml)}
    )


def toml_name(f: Field) -> str | None:
    spec = f.metadata.get("config")
    return None if spec is None else (spec.toml or f.name)


def toml_keys(cls: type) -> set[str]:
    """Every TOML key the dataclass reads."""
    return {name for f in dataclasses.fields(cls) if (name := toml_name(f)) is not None}


def defaults(cls: type[T]) -> dict[str, Any]:
    """Field name -> default, for the fields that have one."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


def bad(path: Path, where: str, message: str) -> ChattermError:
    """The one-line error; `where` is the table ("" for the top level)."""
    if not where.isprintable():  # a quoted TOML key may hold a newline: the error stays one line
        where = ascii(where)[1:-1]
    return ChattermError(f"{path}: [{where}] {message}" if where else f"{path}: {message}")


def skipped(error: str) -> str:
    """How a file's or entry's error is told when the rest loads without it
    (the CLI's warnings and the TUI's start-up notices say it alike)."""
    return f"skipped: {error}"


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def from_table(
    cls: type[T], raw: Mapping[str, Any], *, path: Path, where: str, fixed: Mapping[str, Any] | None = None
) -> T:
    if not isinstance(raw, Mapping):
        raise bad(path, where, "must be a table")
    known = toml_keys(cls)
    unknown = sorted(set(raw) - known)
    if unknown:
        name = unknown[0]
        hint = _dotted_id_hint(raw[name], where, name, known) or _nested_hint(cls, where, name)
        raise bad(path, where, f"unknown key {name!r}{hint}")
    values: dict[str, Any] = dict(fixed or {})
    for f in dataclasses.fields(cls):
        name = toml_name(f)
        if name is None or name not in raw:
            continue
        value = raw[name]
        check = f.metadata["config"].check
        if dataclasses.is_dataclass(check):
            values[f.name] = from_table(check, value, path=path, where=_join(where, name))
            continue
        try:
            values[f.name] = check(value)
        except NotShown as exc:
            raise bad(path, where, f"{name} {exc} (its value is not shown)") from None
        except ValueError as exc:
            raise bad(path, where, f"{name} {_shown(value)} {exc}{_dotted_id_hint(value, where, name, known)}") \
                from None
    try:
        return cls(**values)
    except TypeError:
        missing = [toml_name(f) for f in dataclasses.fields(cls)
                   if f.name not in values and f.default is MISSING and f.default_factory is MISSING]
        raise bad(path, where, f"missing key {missing[0]!r}") from None


def _nested_hint(cls: type, where: str, name: str) -> str:
    """Where a key this table does not take belongs: `temperature` at the top of
    a persona file is a key of its [sampling] table; "" when no table has it."""
    for f in dataclasses.fields(cls):
        check = f.metadata["config"].check if "config" in f.metadata else None
        if dataclasses.is_dataclass(check) and name in toml_keys(check):
            return f"; it belongs in [{_join(where, toml_name(f))}]"
    return ""


def _dotted_id_hint(value: Any, where: str, name: str, known: set[str] | frozenset[str]) -> str:
    """A table of this entry's own keys where a key was expected: TOML read
    `[prices.gpt-4.1]` as [prices] > [gpt-4] > [1], so an id with a dot needs
    quotes; "" else (`n_ctx = {a = 1}` is only a wrong value)."""
    if not isinstance(value, Mapping) or "." not in where or not set(value) & set(known):
        return ""
    kind, entry = where.split(".", 1)
    return f"; an id with a dot needs quotes: [{kind}.\"{entry}.{name}\"]"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


# -- checks ------------------------------------------------------------------
def text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


class NotShown(ValueError):
    """A check's refusal whose error must not quote the value (it may be a secret)."""


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_var_name(value: Any) -> str:
    """The name of an environment variable, or "": a key pasted here by mistake
    is refused without being echoed."""
    if not isinstance(value, str) or (value and not _ENV_NAME.fullmatch(value)):
        raise NotShown("must be the name of an environment variable (letters, digits, _), not the key itself")
    return value


def non_empty_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string")
    return value


INT_MAX = 2**31 - 1
"""Integers go to llama.cpp's C ints: larger ones would overflow there."""


def integer(minimum: int, maximum: int = INT_MAX) -> Check:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise ValueError(f"must be an integer from {minimum} to {maximum}")
        return value

    return check


def number(minimum: float, *, above: bool = False, unit: str = "a number") -> Check:
    """A finite number at least (or, with `above`, more than) `minimum`."""

    def check(value: Any) -> float:
        wrong = ValueError(f"must be {unit} {'>' if above else '>='} {minimum:g}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong
        try:
            number = float(value)
        except OverflowError:  # an integer beyond float range
            raise wrong from None
        if not math.isfinite(number) or number < minimum or (above and number == minimum):
            raise wrong
        return number

    return check


def one_of(*choices: Any) -> Check:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or value not in choices:
            raise ValueError(f"is not one of {', '.join(str(c) for c in choices)}")
        return value

    return check


def auto_or(inner: Check, what: str) -> Check:
    """"auto" or a value `inner` accepts."""

    def check(value: Any) -> Any:
        if value == "auto":
            return value
        try:
            return inner(value)
        except ValueError:
            raise ValueError(f"must be \"auto\" or {what}") from None

    return check


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value
