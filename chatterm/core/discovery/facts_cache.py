"""Header facts remembered by file identity, so a listing reads each GGUF once.

Contract:
- The key is each file's device, inode, size and mtime_ns: a hard link or a
  symlink to the same blob (Ollama, the HF cache, a folder of links) is one
  entry, and a file rewritten in place is read again. It starts with
  `VERDICTS`, so an entry judged by an older chatterm is read again.
- An entry holds the `GgufFacts` or the `Unusable` reason: a truncated file
  is not re-read on every listing either. Only a reason in the file's content
  is kept (not "cannot read": permissions change without the key), with the
  names it was read under, so a hard link under another name reads as itself.
- The cache is a JSON file in chatterm's cache folder, written atomically
  (`save()`), only when something new was read, and keeping the newest
  `MAX_ENTRIES`. A missing, unreadable or garbled file is an empty cache;
  one that cannot be written costs a re-read next time, nothing else.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from chatterm.core.config import paths
from chatterm.core.discovery.gguf_facts import GgufFacts, Unusable, read_facts
from chatterm.core.system.atomic import atomic_write_bytes
from chatterm.core.system.small_file import read_small

MAX_ENTRIES = 2000


def default_cache_file() -> Path:
    return paths.cache_dir() / "gguf-facts.json"


VERDICTS = 2
"""The version of what `read_facts` decides, in every key: bumped when it judges
a file differently (v2: weightless files, lone shards, absurd headers refused,
read errors not kept), so entries an older chatterm wrote are read again."""


def _identity(files: Sequence[Path]) -> str:
    parts = []
    for f in files:
        st = os.stat(f)
        parts.append(f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
    return f"v{VERDICTS}|" + "|".join(parts)


class FactsCache:
    def __init__(self, cache_file: Path | None = None):
        self.file = cache_file or default_cache_file()
        self._entries: dict[str, dict] = {}
        self._dirty = False
        try:
            loaded = json.loads(read_small(self.file, 64 << 20))
        except (OSError, ValueError, RecursionError):  # a garbled file is an empty cache
            loaded = {}
        if isinstance(loaded, dict):
            self._entries = {k: v for k, v in loaded.items() if isinstance(v, dict)}

    def facts(self, files: Sequence[Path]) -> GgufFacts:
        """The facts of a model's files; `Unusable` when they are not a usable model."""
        try:
            key = _identity(files)
        except OSError as exc:
            raise Unusable(f"cannot read {Path(exc.filename or files[0]).name}: {exc.strerror or exc}") from None
        names = [f.name for f in files]
        entry = self._entries.get(key)
        if entry is not None:
            try:
                if "problem" in entry:
                    raise Unusable(_renamed(str(entry["problem"]), entry.get("names"), names))
                return GgufFacts.from_dict(entry["facts"])
            except (KeyError, TypeError):
                pass  # an entry of another shape: read the file again
        try:
            facts = read_facts(files)
        except Unusable as exc:
            if exc.lasting:  # not a file this process could not read: it may be readable next time
                self._remember(key, {"problem": str(exc), "names": names})
            raise
        self._remember(key, {"facts": facts.to_dict()})
        return facts

    def _remember(self, key: str, entry: dict) -> None:
        self._entries.pop(key, None)
        self._entries[key] = entry
        self._dirty = True

    def save(self) -> None:
        if not self._dirty:
            return
        kept = dict(list(self._entries.items())[-MAX_ENTRIES:])
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.file, json.dumps(kept).encode())
        except OSError:
            return  # an unwritable cache folder: the next listing reads the headers again
        self._dirty = False


def _renamed(reason: str, then: object, now: list[str]) -> str:
    """A remembered reason naming the files as they are named now: a hard link
    of a truncated file under another name was said to be the first name read."""
    if isinstance(then, list) and len(then) == len(now):
        for old, new in zip(then, now, strict=True):
            if isinstance(old, str) and old != new:
                reason = reason.replace(old, new)
    return reason
