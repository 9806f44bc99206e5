"""One model a store holds (or a reason it cannot be used), and the rules every
store shares for turning files into models.

Contract:
- `Found.files` is the GGUF, or a split GGUF's shards in order (shard 1
  first); it is empty when `problem` says why the entry is unusable.
- `group_ggufs(paths)` makes models of GGUF file paths: the shards of a split
  (`NAME-00001-of-0000N.gguf`) are one model named by shard 1, a split with a
  shard missing is one unusable entry, and projector (mmproj) files are left
  out (they are not chat models).
- `ggufs_in(folder)` does that for the GGUFs directly in a folder; a file
  there that is a symlink loop or a dangling link is an unusable entry.
- `entries(folder)` lists a folder, or raises `StoreError` with one line for
  a folder that cannot be read; `is_file(path)` and `is_dir(path)` follow
  symlinks and raise `StoreError` for a loop or a dangling link.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

SHARD = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


class StoreError(Exception):
    """A store entry that cannot be read; the message says why."""


@dataclass(frozen=True)
class Found:
    id: str
    """What `--model` takes to name this model."""
    store: str
    """ollama, lmstudio, hf, folder or path."""
    location: Path
    """Where it was found: the manifest, the snapshot file, the folder."""
    files: tuple[Path, ...] = ()
    problem: str | None = None
    n_ctx: int | None = None
    """The context a models.toml entry sets; None: the default this machine affords."""
    kv_type: str = "f16"
    """The KV cache type the model loads with (a models.toml entry's `kv_type`)."""
    on_cpu: bool = False
    """A models.toml entry's `n_gpu_layers = 0`: it loads into RAM, whatever GPU there is."""

    @property
    def usable(self) -> bool:
        return self.problem is None


def is_projector(name: str) -> bool:
    return "mmproj" in name.lower()


def entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise StoreError(f"cannot read folder {folder}: {_why(exc)}") from None


def _stat(path: Path) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"{path.name} is a symlink loop") from None
        if exc.errno == errno.ENOENT and os.path.islink(path):
            raise StoreError(f"{path.name} links to {os.readlink(path)}, which is missing") from None
        raise StoreError(f"cannot read {path}: {_why(exc)}") from None


def is_file(path: Path) -> bool:
    return stat.S_ISREG(_stat(path).st_mode)


def is_dir(path: Path) -> bool:
    return stat.S_ISDIR(_stat(path).st_mode)


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    return exc.strerror or str(exc)


@dataclass
class GgufGroup:
    name: str
    """The file name of the GGUF, or of a split's shard 1."""
    files: tuple[Path, ...] = ()
    problem: str | None = None


def group_ggufs(paths: Iterable[Path]) -> list[GgufGroup]:
    singles: list[GgufGroup] = []
    splits: dict[tuple[Path, str, int], dict[int, Path]] = {}  # by folder, stem, count
    for path in paths:
        if is_projector(path.name):
            continue
        shard = SHARD.match(path.name)
        if shard is None:
            singles.append(GgufGroup(path.name, (path,)))
            continue
        key = (path.parent, shard["stem"], int(shard["count"]))
        splits.setdefault(key, {})[int(shard["no"])] = path
    groups = singles
    for (_folder, stem, count), shards in splits.items():
        name = f"{stem}-00001-of-{count:05d}.gguf"
        missing = [n for n in range(1, count + 1) if n not in shards]
        if missing:
            groups.append(GgufGroup(
                name, problem=f"split GGUF {stem}: shard {missing[0]:05d} of {count:05d} is missing"
            ))
        else:
            groups.append(GgufGroup(name, tuple(shards[n] for n in range(1, count + 1))))
    return sorted(groups, key=lambda g: g.name)


def ggufs_in(folder: Path) -> list[GgufGroup]:
    """The models among the GGUF files directly in `folder`; a file that cannot
    be read (a loop, a dangling link) is a group with its problem."""
    paths: list[Path] = []
    broken: list[GgufGroup] = []
    for entry in entries(folder):
        if not entry.name.lower().endswith(".gguf") or is_projector(entry.name):
            continue
        path = Path(entry.path)
        try:
            if is_file(path):
                paths.append(path)
        except StoreError as exc:
            broken.append(GgufGroup(entry.name, problem=str(exc)))
    return sorted(group_ggufs(paths) + broken, key=lambda g: g.name)
