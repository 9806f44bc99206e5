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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chatterm.core.config import paths, resources
from chatterm.core.config.schema import from_table, integer, key, non_empty_text, number, text
from chatterm.core.config.tomlfile import read_toml
from chatterm.errors import ChattermError

DEFAULT_PERSONA = "assistant"


@dataclass(frozen=True)
class Sampling:
    """The `[sampling]` table; temperature 0 is greedy (deterministic)."""

    temperature: float = key(0.7, check=number(0))
    top_p: float = key(0.9, check=number(0))
    top_k: int = key(40, check=integer(0))
    min_p: float = key(0.05, check=number(0))
    repeat_penalty: float = key(1.1, check=number(0))
    max_tokens: int = key(512, check=integer(1))
    """Upper bound on generated tokens per reply."""
    seed: int | None = key(None, check=integer(0))
    """Pins the random sequence: the same prompt gives the same reply, a
    regenerate included. Unset draws a fresh seed each turn; a sampled reply
    records the seed it drew (F8 shows it, exports have it as `seed`), and
    pinning that value samples the reply again."""

    def repeats_itself(self) -> str | None:
        """Why asking the same prompt again gives the same reply (greedy, or
        a pinned seed), or None when each ask samples anew."""
        if self.temperature == 0:
            return "temperature 0 is greedy"
        if self.seed is not None:
            return f"seed {self.seed} is pinned"
        return None


@dataclass(frozen=True, kw_only=True)
class Persona:
    """One persona file; its id is the file name without `.toml`."""

    id: str
    system_prompt: str = key(check=non_empty_text)
    name: str = key("", check=text)
    """Shown in the UI; the id when empty."""
    description: str = key("", check=text)
    model: str | None = key(None, check=non_empty_text)
    """Model id this persona prefers; None uses the catalog default."""
    sampling: Sampling = key(default_factory=Sampling, check=Sampling)
    source: Path | None = field(default=None, compare=False)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.system_prompt.encode("utf-8")).hexdigest()


def _persona_from(path: Path, raw: dict[str, Any]) -> Persona:
    pid = path.stem
    persona = from_table(Persona, raw, path=path, where="", fixed={"id": pid, "source": path})
    return replace(persona, name=persona.name or pid, system_prompt=persona.system_prompt.strip())


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
