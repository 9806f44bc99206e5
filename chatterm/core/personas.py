"""Personas: a name, a system prompt, an optional model and sampling defaults.

Contract:
- Built-in personas ship as TOML files in `chatterm/personas/`; users add or
  override them with `*.toml` files in the config folder's `personas/`.
  The persona id is the file name without `.toml`.
- A malformed file does not stop the others from loading: it is skipped and its
  one-line error (file and line) is kept in `PersonaSet.errors` for the UI/CLI.
- `Persona.fingerprint` hashes everything that shapes the KV prefix, so a changed
  system prompt never reuses an old KV state file.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatterm.core import paths, resources
from chatterm.core.errors import ChattermError
from chatterm.core.tomlfile import read_toml

DEFAULT_PERSONA = "assistant"


@dataclass(frozen=True)
class Sampling:
    """Sampling defaults; temperature 0 is greedy (deterministic)."""

    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    max_tokens: int = 512
    """Upper bound on generated tokens per reply."""
    seed: int = 1234


@dataclass(frozen=True)
class Persona:
    id: str
    name: str
    system_prompt: str
    description: str = ""
    model: str | None = None
    """Model id this persona prefers; None uses the catalog default."""
    sampling: Sampling = field(default_factory=Sampling)
    source: Path | None = field(default=None, compare=False)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.system_prompt.encode("utf-8")).hexdigest()


_SAMPLING_FIELDS = {f for f in Sampling.__dataclass_fields__}


def _persona_from(path: Path, raw: dict[str, Any]) -> Persona:
    pid = path.stem
    prompt = raw.get("system_prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ChattermError(f"{path}: persona {pid!r} needs a non-empty 'system_prompt'")
    sampling_raw = raw.get("sampling") or {}
    if not isinstance(sampling_raw, dict):
        raise ChattermError(f"{path}: [sampling] must be a table")
    unknown = sorted(set(sampling_raw) - _SAMPLING_FIELDS)
    if unknown:
        raise ChattermError(f"{path}: [sampling] unknown key {unknown[0]!r}")
    try:
        defaults = Sampling()
        sampling = Sampling(
            **{k: type(getattr(defaults, k))(v) for k, v in sampling_raw.items()}
        )
    except (TypeError, ValueError, OverflowError):  # OverflowError: max_tokens = inf
        raise ChattermError(f"{path}: [sampling] values must be numbers") from None
    floats = [getattr(sampling, k) for k in _SAMPLING_FIELDS if isinstance(getattr(sampling, k), float)]
    if not all(math.isfinite(v) for v in floats):  # nan, inf
        raise ChattermError(f"{path}: [sampling] values must be finite numbers")
    if sampling.max_tokens < 1 or sampling.temperature < 0:
        raise ChattermError(f"{path}: [sampling] max_tokens must be >= 1 and temperature >= 0")
    model = raw.get("model")
    return Persona(
        id=pid,
        name=str(raw.get("name", pid)),
        system_prompt=prompt.strip(),
        description=str(raw.get("description", "")),
        model=str(model) if model else None,
        sampling=sampling,
        source=path,
    )


def load_persona_file(path: Path) -> Persona:
    return _persona_from(path, read_toml(path))


@dataclass
class PersonaSet:
    personas: dict[str, Persona]
    errors: list[str]
    broken: dict[str, str] = field(default_factory=dict)
    """Persona id -> why its file was skipped."""

    def get(self, persona_id: str | None) -> Persona:
        persona_id = persona_id or DEFAULT_PERSONA
        try:
            return self.personas[persona_id]
        except KeyError:
            if persona_id in self.broken:
                raise ChattermError(self.broken[persona_id]) from None
            valid = ", ".join(sorted(self.personas)) or "(none)"
            raise ChattermError(f"unknown persona {persona_id!r}; valid personas: {valid}") from None

    def __iter__(self):
        return iter(sorted(self.personas.values(), key=lambda p: p.id))


def load_personas(user_dir: Path | None = None) -> PersonaSet:
    """Built-in personas, then the user's (which override built-ins of the same id)."""
    user_dir = paths.user_personas_dir() if user_dir is None else user_dir
    found: dict[str, Persona] = {}
    errors: list[str] = []
    broken: dict[str, str] = {}
    folders = [resources.builtin_personas_dir()]
    if user_dir.is_dir():
        folders.append(user_dir)
    for folder in folders:
        for path in sorted(folder.glob("*.toml")):
            try:
                persona = load_persona_file(path)
            except ChattermError as exc:
                errors.append(str(exc))
                broken[path.stem] = str(exc)
                continue
            broken.pop(path.stem, None)
            found[persona.id] = persona
    return PersonaSet(found, errors, {k: v for k, v in broken.items() if k not in found})
