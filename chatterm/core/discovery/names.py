"""Model names `--model` and a models.toml `source` take besides catalog ids.

Contract:
- `ollama:MODEL[:TAG]` (also `NAMESPACE/MODEL`, `HOST/NAMESPACE/MODEL`),
  `lmstudio:PUBLISHER/REPO[/FILE]`, `hf:[ORG/]NAME[:FILE]`, or a GGUF path
  (it holds a `/`, starts with `~` or ends in `.gguf`); `is_model_name` says
  whether a text is one of those.
- `resolve(name)` finds the model in its store without scanning the others:
  a `Found`, or a one-line `ChattermError` naming the name and what is
  wrong (no such model, several match and which, why it is unusable).
- The stores' folders come from the environment and the home folder
  (`STORES`, each module's contract says which); `env` and `home` are
  parameters so a caller (a test) can point them elsewhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

from chatterm.core.discovery import folders, hf_cache, lmstudio, ollama
from chatterm.core.discovery.found import Found, StoreError
from chatterm.errors import ChattermError


@dataclass(frozen=True)
class Store:
    name: str
    label: str
    syntax: str
    roots: Callable[[Mapping[str, str], Path], list[Path]]
    scan: Callable[[Path], Iterator[Found]]
    find: Callable[[str, list[Path]], list[Found]]
    shared_roots: Callable[[], list[Path]] = list
    """System-wide roots another user owns: skipped, not listed as unusable, when this user cannot read them."""

    @property
    def prefix(self) -> str:
        return f"{self.name}:"


STORES = (
    Store("ollama", "Ollama", "ollama:MODEL[:TAG]", ollama.roots, ollama.scan, ollama.find, ollama.shared_roots),
    Store("lmstudio", "LM Studio", "lmstudio:PUBLISHER/REPO[/FILE]", lmstudio.roots, lmstudio.scan, lmstudio.find),
    Store("hf", "Hugging Face cache", "hf:[ORG/]NAME[:FILE]", hf_cache.roots, hf_cache.scan, hf_cache.find),
)


def store_of(name: str) -> Store | None:
    return next((s for s in STORES if name.startswith(s.prefix)), None)


def is_path_name(name: str) -> bool:
    return "/" in name or os.sep in name or name.startswith("~") or name.lower().endswith(".gguf")


def is_model_name(name: str) -> bool:
    return store_of(name) is not None or is_path_name(name)


def resolve(name: str, env: Mapping[str, str] | None = None, home: Path | None = None) -> Found:
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    store = store_of(name)
    if store is None:
        found = folders.find(Path(name).expanduser())
        if found.problem:
            raise ChattermError(f"model {name!r}: {found.problem}")
        return found
    roots = store.roots(env, home)
    try:
        matches = store.find(name[len(store.prefix):], roots)
    except StoreError as exc:
        raise ChattermError(f"model {name!r}: {exc}; the form is {store.syntax}") from None
    if not matches:
        where = ", ".join(str(r) for r in roots)
        raise ChattermError(
            f"model {name!r}: not found in {store.label} ({where}); `chatterm models` lists what is there"
        )
    if len(matches) > 1:
        choices = ", ".join(m.id for m in matches)
        raise ChattermError(f"model {name!r} names {len(matches)} models; choose one: {choices}")
    found = matches[0]
    if found.problem:
        raise ChattermError(f"model {name!r}: {found.problem}")
    return found
