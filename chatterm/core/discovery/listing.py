"""Every model on this machine: what `chatterm models` and the model picker show.

Contract:
- `store_roots()` says of each store folder chatterm looks in whether it is
  scanned: not when it does not exist, when it is a folder already scanned
  (reached through a symlink or two variables), or when it is a system-wide
  folder (Ollama's service install) this user cannot read; an unreadable
  folder of the user's own is scanned, so its reason is listed.
- `discover(model_folders)` scans the store folders `store_roots()` marks
  and then the folders models.toml names, in that order; it never writes to
  them.
- `configured(catalog)`: the local models models.toml defines (the
  shipped default model among them), by their ids, store "models.toml",
  with the entry's `n_ctx` and `kv_type`: their row's KV/token and fit are
  at those (and against RAM with `n_gpu_layers = 0`); one whose file cannot
  be used is an entry with the reason, and so is an entry models.toml's
  checks skipped (the reason its error).
- `list_models(...)` adds each model's header facts (through `FactsCache`),
  its default context and whether it fits `machine_memory()`: the
  `configured` entries it is given first, then what `discover` finds, one
  row per id (`unique`). A bad entry is a row with its reason
  (`ModelRow.problem`), never an exception.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from chatterm.core.config.catalog import ModelCatalog
from chatterm.core.discovery import folders
from chatterm.core.discovery.facts_cache import FactsCache
from chatterm.core.discovery.fit import (
    MIN_CTX,
    Memory,
    default_n_ctx,
    fits,
    kv_bytes_per_token,
    machine_memory,
    needed_bytes,
    ram,
)
from chatterm.core.discovery.found import Found
from chatterm.core.discovery.gguf_facts import GgufFacts, Unusable
from chatterm.core.discovery.names import STORES
from chatterm.errors import ChattermError


@dataclass(frozen=True)
class ModelRow:
    found: Found
    facts: GgufFacts | None = None
    problem: str | None = None
    n_ctx: int | None = None
    """The default context on this machine; None: it does not fit."""
    needed_bytes: int | None = None
    """Weights + KV cache at `n_ctx` (at the smallest context when it does not fit)."""

    @property
    def id(self) -> str:
        return self.found.id

    @property
    def usable(self) -> bool:
        return self.problem is None

    @property
    def fits(self) -> bool:
        return self.usable and self.n_ctx is not None

    @property
    def kv_bytes_per_token(self) -> int | None:
        """The KV cache one token costs at the KV type this model loads with."""
        return None if self.facts is None else kv_bytes_per_token(self.facts, self.found.kv_type)

    def to_dict(self) -> dict[str, Any]:
        facts = self.facts.to_dict() if self.facts else dict.fromkeys(GgufFacts.field_names())
        return {
            "id": self.id,
            "store": self.found.store,
            "location": str(self.found.location),
            "files": [str(f) for f in self.found.files],
            "usable": self.usable,
            "problem": self.problem,
            **facts,
            "kv_type": self.found.kv_type,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "default_n_ctx": self.n_ctx,
            "needed_bytes": self.needed_bytes,
            "fits": self.fits,
        }


SCANNED = "scanned"


@dataclass(frozen=True)
class StoreRoot:
    store: str
    """The store's name (ollama, lmstudio, hf)."""
    path: Path
    state: str
    """SCANNED, or why not."""

    @property
    def scanned(self) -> bool:
        return self.state == SCANNED


def _state(root: Path, shared: bool) -> str:
    try:
        os.stat(root)
    except FileNotFoundError:
        return "not there" if not os.path.islink(root) else SCANNED  # a dangling link: listed with its reason
    except NotADirectoryError:
        return "not there"
    except OSError as exc:
        if not shared:
            return SCANNED
        return f"skipped: this user cannot read it ({exc.strerror or exc})"
    if shared and not os.access(root, os.R_OK | os.X_OK):
        return "skipped: this user cannot read it"
    return SCANNED


def store_roots(env: Mapping[str, str] | None = None, home: Path | None = None) -> list[StoreRoot]:
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    seen: dict[str, Path] = {}
    out = []
    for store in STORES:
        shared = store.shared_roots()
        for root in store.roots(env, home):
            state = _state(root, root in shared)
            real = os.path.realpath(root)
            if state == SCANNED and real in seen:
                state = f"the same folder as {seen[real]}"
            elif state == SCANNED:
                seen[real] = root
            out.append(StoreRoot(store.name, root, state))
    return out


def discover(model_folders: Iterable[Path] = (), env: Mapping[str, str] | None = None,
             home: Path | None = None) -> list[Found]:
    scanners = {store.name: store.scan for store in STORES}
    found: list[Found] = []
    for root in store_roots(env, home):
        if root.scanned:
            found.extend(scanners[root.store](root.path))
    for folder in model_folders:
        found.extend(folders.scan(Path(folder).expanduser()))
    return found


CONFIGURED = "models.toml"
"""The store name of a model models.toml defines."""


def configured(catalog: ModelCatalog) -> list[Found]:
    """The catalog's local models, and its skipped entries as unusable ones
    (their error the reason), whatever kind they meant (the kind may be what
    is wrong): a listing that left them out would count a typo'd entry nowhere."""
    found = []
    for mid, error in catalog.broken.items():
        if mid in catalog.models:
            continue  # a broken override of a bundled model: the bundled one stands (and was warned of)
        where = catalog.broken_in.get(mid, Path("models.toml"))
        found.append(Found(mid, CONFIGURED, where, problem=error.removeprefix(f"{where}: ")))
    for spec in catalog.models.values():
        if spec.kind != "local":
            continue
        try:
            path = spec.gguf_file()
        except ChattermError as exc:
            found.append(Found(spec.id, CONFIGURED, spec.defined_in or Path(spec.source), problem=str(exc)))
        else:
            files = folders.find(path)  # shard 1 of a split: all its shards, or which one is missing
            found.append(Found(spec.id, CONFIGURED, path, files.files, files.problem, n_ctx=spec.n_ctx,
                               kv_type=spec.kv_type, on_cpu=spec.n_gpu_layers == 0))
    return found


def describe(found: Found, cache: FactsCache, memory: Memory) -> ModelRow:
    if found.problem:
        return ModelRow(found, problem=found.problem)
    if not all(_utf8(str(f)) for f in found.files):
        return ModelRow(found, problem="its path is not UTF-8, and llama-cpp-python opens a model by a UTF-8 path; "
                                       "rename the folder or file")
    try:
        facts = cache.facts(found.files)
    except Unusable as exc:
        return ModelRow(found, problem=str(exc))
    kv_type = found.kv_type
    if found.on_cpu and memory.kind == "GPU":
        memory = ram()
    if found.n_ctx is not None:
        n_ctx = found.n_ctx if fits(facts, memory, found.n_ctx, kv_type) else None
        return ModelRow(found, facts, n_ctx=n_ctx, needed_bytes=needed_bytes(facts, found.n_ctx, kv_type))
    n_ctx = default_n_ctx(facts, memory)
    smallest = min(facts.context_length or MIN_CTX, MIN_CTX)
    return ModelRow(found, facts, n_ctx=n_ctx, needed_bytes=needed_bytes(facts, n_ctx or smallest))


def list_models(model_folders: Iterable[Path] = (), *, env: Mapping[str, str] | None = None,
                home: Path | None = None, cache: FactsCache | None = None,
                memory: Memory | None = None, configured: Iterable[Found] = ()) -> list[ModelRow]:
    cache = cache or FactsCache()
    memory = memory or machine_memory()
    rows = [describe(f, cache, memory) for f in unique([*configured, *discover(model_folders, env, home)])]
    cache.save()
    return rows


def unique(found: Iterable[Found]) -> list[Found]:
    """One row per id: an id found again for the same files (folders that
    overlap, a models.toml entry named as the store names the model) is left
    out; for other files (one LM Studio repo in both of its folders) it is
    unusable, since `--model ID` loads the first."""
    first: dict[str, Found] = {}
    out = []
    for f in found:
        seen = first.setdefault(f.id, f)
        if seen is f or f.problem is not None:  # an unusable one keeps its own reason (a folder's several)
            out.append(f)
        elif not _same_files(seen, f):
            out.append(replace(f, files=(), problem=f"{seen.location} has the same id, listed first; "
                                                     f"--model {f.id} loads that one"))
    return out


def _same_files(a: Found, b: Found) -> bool:
    """Whether both are the same files (a hard link or a symlink is the file)."""
    return bool(a.files) and len(a.files) == len(b.files) and all(map(_same_file, a.files, b.files))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _utf8(text: str) -> bool:
    """Whether a path's name is UTF-8 (an undecodable byte is a lone surrogate here)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
