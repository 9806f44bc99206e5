"""Plain folders of GGUFs (models.toml's `[defaults] model_folders`) and GGUF paths.

Contract:
- `scan(folder)` lists the models in the folder and its subfolders (symlinked
  folders are not followed); each model's id is its path, which `--model`
  takes as it is.
- `find(path)` is the model a path names: a GGUF, or shard 1 of a split
  (its other shards are found beside it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from chatterm.core.discovery.found import SHARD, Found, StoreError, entries, ggufs_in, group_ggufs, is_file


def scan(folder: Path) -> Iterator[Found]:
    if not folder.exists() and not folder.is_symlink():
        yield Found(str(folder), "folder", folder, problem=f"folder {folder} does not exist")
        return
    problems: list[StoreError] = []

    def note(exc: OSError) -> None:
        problems.append(StoreError(f"cannot read folder {exc.filename}: {exc.strerror or exc}"))

    for here, dirs, _files in os.walk(folder, onerror=note, followlinks=False):
        dirs.sort()
        try:
            groups = ggufs_in(Path(here))
        except StoreError as exc:
            problems.append(exc)
            continue
        for group in groups:
            path = Path(here) / group.name
            yield Found(str(path), "folder", Path(here), group.files, group.problem)
    for problem in problems:
        yield Found(str(folder), "folder", folder, problem=str(problem))


def find(path: Path) -> Found:
    name = str(path)
    try:
        if not is_file(path):
            return Found(name, "path", path, problem=f"{path} is not a file")
    except StoreError as exc:
        return Found(name, "path", path, problem=str(exc))
    shard = SHARD.match(path.name)
    if shard is None:
        return Found(name, "path", path, (path,))
    if int(shard["no"]) != 1:
        return Found(name, "path", path, problem=f"{path.name} is not shard 1 of its split; name shard 00001")
    try:
        siblings = [Path(e.path) for e in entries(path.parent) if SHARD.match(e.name)]
    except StoreError as exc:
        return Found(name, "path", path, problem=str(exc))
    for group in group_ggufs(siblings):
        if group.name == path.name:
            return Found(name, "path", path, group.files, group.problem)
    return Found(name, "path", path, problem=f"{path.name}: its split's shards were not found")
