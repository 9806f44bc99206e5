"""The Hugging Face hub cache, read in place.

Contract:
- The cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
  `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub` (the
  first one set, as huggingface_hub chooses it).
- A repo is `models--ORG--NAME` (`models--NAME` for one of no organisation,
  such as gpt2); its current revision is the commit in
  `refs/main` (else its newest snapshot), its files are under
  `snapshots/REV/`, symlinks into `blobs/`. GGUFs in subfolders of the
  snapshot count too.
- Ids: `hf:ORG/NAME` (`hf:NAME`) when the revision holds one model, `hf:ORG/NAME:FILE`
  (FILE relative to the snapshot, a split's shard 1) for each when it holds
  several. A snapshot file that is a symlink loop or links to a missing blob
  is an unusable entry with that reason; symlinked folders are not followed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Mapping

from chatterm.core.discovery.found import Found, StoreError, entries, ggufs_in
from chatterm.core.system.small_file import read_small

REPO_PREFIX = "models--"


def roots(env: Mapping[str, str], home: Path) -> list[Path]:
    if env.get("HF_HUB_CACHE"):
        return [Path(env["HF_HUB_CACHE"]).expanduser()]
    if env.get("HF_HOME"):
        return [Path(env["HF_HOME"]).expanduser() / "hub"]
    if env.get("XDG_CACHE_HOME"):
        return [Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub"]
    return [home / ".cache" / "huggingface" / "hub"]


def _snapshot(repo: Path) -> Path | None:
    try:
        rev = read_small(repo / "refs" / "main", 4096).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        rev = ""
    if rev and "/" not in rev and rev not in (".", "..") and (repo / "snapshots" / rev).is_dir():
        return repo / "snapshots" / rev
    try:
        snapshots = [Path(e.path) for e in entries(repo / "snapshots") if e.is_dir(follow_symlinks=False)]
    except StoreError:
        return None
    return max(snapshots, key=lambda p: p.stat().st_mtime_ns, default=None)


def _repo(repo: Path) -> list[Found]:
    org, _, name = repo.name[len(REPO_PREFIX):].partition("--")
    base = f"hf:{org}/{name}" if name else f"hf:{org}"  # models--gpt2: a repo of no organisation
    snapshot = _snapshot(repo)
    if snapshot is None:
        return []
    found: list[tuple[str, Path, tuple[Path, ...], str | None]] = []
    try:
        for folder, dirs, _files in os.walk(snapshot, onerror=_raise, followlinks=False):
            dirs.sort()
            for group in ggufs_in(Path(folder)):
                rel = str((Path(folder) / group.name).relative_to(snapshot))
                found.append((rel, Path(folder) / group.name, group.files, group.problem))
    except StoreError as exc:
        return [Found(base, "hf", snapshot, problem=str(exc))]
    return [
        Found(base if len(found) == 1 else f"{base}:{rel}", "hf", location, files, problem)
        for rel, location, files, problem in found
    ]


def _raise(exc: OSError) -> None:
    raise StoreError(f"cannot read folder {exc.filename}: {exc.strerror or exc}")


def scan(root: Path) -> Iterator[Found]:
    try:
        repos = entries(root)
    except StoreError as exc:
        yield Found(f"hf:{root}", "hf", root, problem=str(exc))
        return
    for repo in repos:
        if repo.name.startswith(REPO_PREFIX) and repo.is_dir():
            yield from _repo(Path(repo.path))


def find(name: str, store_roots: list[Path]) -> list[Found]:
    repo_name, _, file = name.partition(":")
    org, slash, model = repo_name.partition("/")
    parts = (org, model) if slash else (org,)
    if not all(parts) or "/" in model or "--" in repo_name or any(p in (".", "..") for p in parts):
        raise StoreError(f"hf:{name} is not a Hugging Face model name (hf:[ORG/]NAME[:FILE])")
    for root in store_roots:
        repo = root / f"{REPO_PREFIX}{'--'.join(parts)}"
        if not os.path.isdir(repo):  # False, not an error, where this user cannot look
            continue
        models = _repo(repo)
        if file:
            snapshot = _snapshot(repo)
            return [m for m in models if snapshot and m.location == snapshot / file]
        return models
    return []
