"""LM Studio's model folder, read in place.

Contract:
- Homes: `$LMSTUDIO_HOME`, the path in `~/.lmstudio-home-pointer`,
  `~/.cache/lm-studio`, `~/.lmstudio`. A home's models are in
  `models/PUBLISHER/REPO/*.gguf`, or under the `downloadsFolder` its
  `settings.json` names.
- Ids: `lmstudio:PUBLISHER/REPO` when the repo folder holds one model,
  `lmstudio:PUBLISHER/REPO/FILE` (FILE the GGUF's name, a split's shard 1)
  for each when it holds several; `find` accepts either form when it is
  unambiguous.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator, Mapping

from chatterm.core.discovery.found import Found, GgufGroup, StoreError, entries, ggufs_in, is_dir
from chatterm.core.system.small_file import read_small

POINTER_FILE = ".lmstudio-home-pointer"


def homes(env: Mapping[str, str], home: Path) -> list[Path]:
    found: list[Path] = []
    if env.get("LMSTUDIO_HOME"):
        found.append(Path(env["LMSTUDIO_HOME"]).expanduser())
    try:
        pointed = read_small(home / POINTER_FILE, 64 << 10).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        pointed = ""
    if pointed:
        found.append(Path(pointed).expanduser())
    found += [home / ".cache" / "lm-studio", home / ".lmstudio"]
    return found


def models_folder(lm_home: Path) -> Path:
    """`downloadsFolder` from the home's settings.json, else `models/`."""
    try:
        settings = json.loads(read_small(lm_home / "settings.json", 1 << 20))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deeply
        settings = None
    folder = settings.get("downloadsFolder") if isinstance(settings, dict) else None
    if isinstance(folder, str) and folder:
        return Path(folder).expanduser()
    return lm_home / "models"


def roots(env: Mapping[str, str], home: Path) -> list[Path]:
    return [models_folder(h) for h in homes(env, home)]


def _repo_models(repo: Path, publisher: str, groups: list[GgufGroup]) -> list[Found]:
    base = f"lmstudio:{publisher}/{repo.name}"
    out = []
    for group in groups:
        mid = base if len(groups) == 1 else f"{base}/{group.name}"
        out.append(Found(mid, "lmstudio", repo / group.name, group.files, group.problem))
    return out


def _repo(repo: Path, publisher: str) -> list[Found]:
    try:
        return _repo_models(repo, publisher, ggufs_in(repo))
    except StoreError as exc:
        return [Found(f"lmstudio:{publisher}/{repo.name}", "lmstudio", repo, problem=str(exc))]


def _folders_in(folder: Path, prefix: str) -> Iterator[tuple[Path, Found | None]]:
    """Each subfolder (not hidden) of `folder`, or the entry saying why it cannot be read."""
    try:
        children = entries(folder)
    except StoreError as exc:
        yield folder, Found(f"lmstudio:{prefix or folder}", "lmstudio", folder, problem=str(exc))
        return
    for child in children:
        path = Path(child.path)
        if child.name.startswith("."):
            continue
        try:
            if is_dir(path):
                yield path, None
        except StoreError as exc:
            yield path, Found(f"lmstudio:{prefix}{child.name}", "lmstudio", path, problem=str(exc))


def scan(root: Path) -> Iterator[Found]:
    for publisher, problem in _folders_in(root, ""):
        if problem is not None:
            yield problem
            continue
        for repo, problem in _folders_in(publisher, f"{publisher.name}/"):
            if problem is not None:
                yield problem
            else:
                yield from _repo(repo, publisher.name)


def find(name: str, store_roots: list[Path]) -> list[Found]:
    parts = name.split("/")
    if len(parts) not in (2, 3) or any(p in ("", ".", "..") for p in parts):
        raise StoreError(f"lmstudio:{name} is not an LM Studio model name (lmstudio:PUBLISHER/REPO[/FILE])")
    for root in store_roots:
        repo = root / parts[0] / parts[1]
        if not os.path.isdir(repo):  # False, not an error, where this user cannot look
            continue
        models = _repo(repo, parts[0])
        if len(parts) == 3:
            return [m for m in models if m.location.name == parts[2]]
        return models
    return []
