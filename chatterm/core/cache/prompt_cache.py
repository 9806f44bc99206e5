"""The prompt cache: KV states identified by their exact token sequence, in RAM
and on disk, and found by the longest token prefix they share with a prompt.

Contract:
- An entry is the KV state of a token sequence, plus the compatibility fields
  it was computed under (`kv_state.compat_fields`: model file, llama.cpp build,
  KV types, rope ...). It occupies a slot: ("persona", persona id) for a
  persona's shareable prefix, ("session", session id) for a conversation
  (`session_slot`: "ID@SCOPE" for a database other than the data folder's,
  since databases share the folder and their ids). A slot holds one entry per
  model; saving a slot replaces its entry.
- A state in llama.cpp's sequence layout (`state_layout.parse`) is kept as a
  chain of blocks (`chatterm.core.cache.block_store`): blocks shared with
  other entries (a session's persona, the previous turn) are stored once, a
  save writes only the new blocks and a small chain record, a restore
  assembles the blob in memory. The first state of each (model, compat) must
  survive `state_layout.split` + `join` byte for byte; when it does not, or a
  state cannot be cut (a shifted context), the state is kept whole, as one
  state file, and the mismatch is logged once: nothing is lost.
- Two tiers. RAM: blocks (or whole states as captured, no copy), least
  recently used evicted beyond `ram_budget_bytes` (default 1 GiB). Disk:
  `<folder>/<model>/blocks/*.kvblock` and `<kind>-<key>.kvchain` records, or
  one whole state file `<kind>-<key>.kvstate` (`state_file`: magic, JSON
  header, raw payload; earlier versions wrote only these, and they are still
  read, and replaced by blocks when their slot is saved again), written by one
  background writer; beyond `disk_budget_bytes` whole-state files go first,
  then blocks, least recently used. A failed write turns disk saving off for
  the process and keeps the reason in `write_error`.
- `lookup(model_id, compat, prompt)` returns every usable entry sharing at
  least `min_shared` tokens with `prompt`, best first: most shared tokens,
  then the model's own before another's, then RAM before disk. Another
  model id's entry is usable when its compat is the same in every field
  (two catalog entries for one GGUF file, differing in `n_ctx` or sampling,
  share their states; the reuse is said, `Entry.model_id`); one that is not
  is that model's business, not a miss. `shared` is capped at len(prompt) - 1 (one prompt
  token is always decoded, for its logits), and, for a chain, at the tokens
  its present blocks hold. The caller compares with its live context first,
  restores the best candidate with `open()` + `kv_state.restore`, trims it to
  `shared`, and on a failed restore `discard()`s it and tries the next one.
  A chain's `open()` assembles just the `shared` tokens; `reserve(model,
  slot)` readies the memory it will assemble into ahead of time.
- A state file's JSON header is parsed once per version of the file (device,
  inode, size, mtime): lookups and `open()` use that parse. A file saved again
  since the lookup is a miss at `open()`, never a payload under another header.
- Every miss has a reason in `Lookup.misses`: an expected slot with no entry
  ("missing"), one whose tokens the prompt no longer starts with ("another version"),
  a truncated, corrupt or unreadable file, a file from another model or
  build (the first differing compat field is named), evicted, damaged or
  foreign blocks. A disk entry's payload is checked against its CRC-32s while
  it is restored (`OpenedState.verify`); `verify_files()` checks every state
  file, block and chain record, sha256 included.
- Nothing here touches llama.cpp: the payload is bytes in, bytes out.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from chatterm.core.cache import state_file, state_layout
from chatterm.core.cache.block_store import DEFAULT_BLOCK_TOKENS, BadRecord, BlockStore, Chain, FileCheck, ModelUsage
from chatterm.core.cache.state_layout import Layout, LayoutError
from chatterm.core.cache.tokens import common_prefix_len
from chatterm.core.system.atomic import TEMP_SUFFIX, ensure_private_dir, sweep_temp_files

log = logging.getLogger(__name__)

KINDS = ("persona", "session")
_STATE_TEMP_FILES = ("*/.*" + TEMP_SUFFIX, "*/blocks/.*" + TEMP_SUFFIX)
"""Temp files of state and block writers, in the per-model folders."""
DEFAULT_RAM_BUDGET_BYTES = 1 << 30
DEFAULT_DISK_BUDGET_BYTES = 2 << 30
RAM, DISK = "ram", "disk"


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


@dataclass(frozen=True)
class Slot:
    kind: str
    """"persona" or "session"."""
    key: str
    """The persona id, or the session id as a string; "ID@SCOPE" for a session
    of a database other than the data folder's (`PromptCache.session_scope`)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            # _shown: the kind may come from a damaged file's header (any JSON, any size).
            raise ValueError(f"slot kind {_shown(self.kind)} is not one of {', '.join(KINDS)}")

    @classmethod
    def persona(cls, persona_id: str) -> "Slot":
        return cls("persona", persona_id)

    @classmethod
    def session(cls, session_id: int | str, scope: str = "") -> "Slot":
        return cls("session", f"{session_id}@{scope}" if scope else str(session_id))

    @property
    def session_id(self) -> str:
        """A session slot's id, without its database's scope."""
        return self.key.partition("@")[0]

    @property
    def scope(self) -> str:
        """A session slot's database (`PromptCache.session_scope`)."""
        return self.key.partition("@")[2]

    def is_of(self, kind: str | None, key: str | None) -> bool:
        """Whether the slot is one `clear(kind, key)` removes (None: any)."""
        return (kind is None or self.kind == kind) and (key is None or self.key == key)

    @property
    def label(self) -> str:
        """"persona shop-support", "session 12" or "session 12 of database 3f2a9c1e"."""
        if self.kind == "session" and self.scope:
            return f"session {self.session_id} of database {self.scope}"
        return f"{self.kind} {self.key}"

    @property
    def file_name(self) -> str:
        return f"{self.kind}-{_safe_name(self.key)}{state_file.SUFFIX}"


@dataclass
class Entry:
    slot: Slot
    model_id: str
    tokens: list[int]
    nbytes: int
    """Payload bytes (RAM) or file bytes (disk)."""
    tier: str
    last_used: float
    compat: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)
    """What the writer added: prefill_ms, state_size, ..."""
    path: Path | None = None
    payload: Any = None
    """RAM only: the captured buffer."""
    problem: str = ""
    """Why this entry cannot be used (shown by `cache ls`); empty when fine."""
    chain: Chain | None = None
    """The blocks holding this state; None for a whole-state entry."""


@dataclass(frozen=True)
class Candidate:
    entry: Entry
    shared: int
    """Tokens of the prompt this entry provides (<= len(prompt) - 1)."""


@dataclass
class Lookup:
    candidates: list[Candidate]
    """Best first."""
    misses: list[str]


@dataclass
class OpenedState:
    tokens: list[int]
    payload: Any
    verify: Callable[[], bool] | None
    """Checks the payload's digests (disk); None for RAM entries."""
    _close: Callable[[], None] = lambda: None

    def close(self) -> None:
        """Release the mapping; every buffer made from `payload` must be gone."""
        self._close()


@dataclass(frozen=True)
class Miss:
    reason: str


def _shown(value: Any, limit: int = 40) -> str:
    """A header key or value in a one-line reason, cut short (a corrupt file may hold megabytes)."""
    if isinstance(value, str) and len(value) > 24:
        value = value[:12] + "…"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_difference(found: dict[str, Any], expected: dict[str, Any]) -> str | None:
    for key in sorted(set(found) | set(expected), key=str):
        if found.get(key) != expected.get(key):
            name = key.replace("_", " ") if key.isidentifier() and len(key) <= 40 else _shown(key)
            return f"{name} differs (file {_shown(found.get(key))}, now {_shown(expected.get(key))})"
    return None


def _compat_miss(label: str, difference: str) -> str:
    what = "build" if "llama cpp" in difference else "model or settings"
    return f"{label}: other {what}: {difference}"


def _slot_of_file(path: Path) -> Slot:
    """The slot a file name says (for files whose header cannot be read)."""
    kind, _, key = path.stem.partition("-")
    return Slot(kind, key) if kind in KINDS and key else Slot.persona(path.stem)


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """Which file, in which version: a save replaces a file (a new inode), an
    in-place write changes its size or mtime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _Indexed:
    stamp: tuple[int, int, int, int]
    """`_stamp` of the file whose header `entry` was parsed from."""
    entry: Entry
    header: state_file.Header | None
    """None when the file had no header to read (`entry.problem` says why)."""


class PromptCache:
    def __init__(
        self,
        folder: Path,
        disk_budget_bytes: int = DEFAULT_DISK_BUDGET_BYTES,
        ram_budget_bytes: int = DEFAULT_RAM_BUDGET_BYTES,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        session_scope: str = "",
    ):
        self.folder = folder
        self.session_scope = session_scope
        """Whose session ids this cache's session slots are (`session_slot`):
        ids are unique within one database only, and databases may share a
        cache folder. "" for the data folder's own database."""
        self.disk_budget_bytes = disk_budget_bytes
        self.ram_budget_bytes = ram_budget_bytes
        self.write_error: str | None = None
        self._lock = threading.Lock()
        self._ram: OrderedDict[tuple[str, Slot], Entry] = OrderedDict()
        self._index: dict[Path, _Indexed] = {}
        self._queue: queue.Queue[tuple[str, Slot, list[int], Any, dict, dict] | None] = queue.Queue()
        self._queued_seq: dict[tuple[str, Slot], int] = {}
        self._writer: threading.Thread | None = None
        self._seq = 0
        self.blocks = BlockStore(folder, ram_budget_bytes, block_tokens)
        self._layouts: dict[tuple[str, str], bool] = {}
        """(model, compat) -> whether its states survived a split and join."""
        self._noted: set[tuple[str, str]] = set()

    def session_slot(self, session_id: int) -> Slot:
        """The slot of session `session_id` of this cache's database."""
        return Slot.session(session_id, self.session_scope)

    # -- paths -----------------------------------------------------------
    def path_for(self, model_id: str, slot: Slot) -> Path:
        return self.folder / _safe_name(model_id) / slot.file_name

    # -- storing ---------------------------------------------------------
    def put(
        self,
        model_id: str,
        slot: Slot,
        tokens: Sequence[int],
        payload: Any,
        compat: dict[str, Any],
        info: dict[str, Any] | None = None,
        disk: bool = True,
    ) -> None:
        """Keep a captured state: in RAM now (as blocks, only the tokens no RAM
        block holds yet are copied; a whole state is kept as captured), on disk
        in the background.

        `payload` must not change afterwards (`kv_state.capture` always returns
        a new buffer)."""
        tokens = list(tokens)
        info = dict(info or {})
        nbytes = memoryview(payload).nbytes
        layout = self._layout_for(model_id, compat, payload)
        if layout is not None:
            with self._lock:
                self._ram.pop((model_id, slot), None)  # a slot holds one entry: now its chain
            self.blocks.store(model_id, slot.kind, slot.key, tokens, payload, layout, compat, info, disk=False)
        else:
            self.blocks.forget_ram(model_id, slot.kind, slot.key)
        if layout is None and nbytes <= self.ram_budget_bytes:
            entry = Entry(slot, model_id, tokens, nbytes, RAM, time.time(), compat, info, payload=payload)
            with self._lock:
                self._ram.pop((model_id, slot), None)
                self._ram[(model_id, slot)] = entry
                self._evict_ram()
        if disk and self.write_error is None:
            with self._lock:
                self._seq += 1
                self._queued_seq[(model_id, slot)] = self._seq
                self._queue.put((model_id, slot, tokens, payload, compat, info | {"_seq": self._seq}))
                if self._writer is None or not self._writer.is_alive():
                    self._writer = threading.Thread(target=self._write_loop, name="prompt-cache-writer",
                                                    daemon=True)
                    self._writer.start()

    def _layout_for(self, model_id: str, compat: dict[str, Any], payload: Any) -> Layout | None:
        """The payload's layout when it is stored as blocks; None for a whole state.
        The first state of each (model, compat) must survive a split and join
        byte for byte, else that model keeps whole states (said once)."""
        try:
            layout = state_layout.parse(payload)
        except LayoutError as exc:
            if (model_id, str(exc)) not in self._noted:
                self._noted.add((model_id, str(exc)))
                log.info("prompt cache: %s: whole states kept (%s)", model_id, exc)
            return None
        key = (model_id, json.dumps(compat, sort_keys=True, default=str))
        with self._lock:
            ok = self._layouts.get(key)
        if ok is None:
            n, step = layout.n_tokens, self.blocks.block_tokens
            ranges = [(a, min(a + step, n)) for a in range(0, n, step)]
            joined = state_layout.join(layout.frame, state_layout.split(payload, layout, ranges),
                                       [b - a for a, b in ranges])
            ok = joined == memoryview(payload).cast("B")
            with self._lock:
                self._layouts[key] = ok
            if not ok:
                log.warning("prompt cache: %s: a KV state did not survive a split and join byte for byte; "
                            "keeping whole states for this model and settings", model_id)
        return layout if ok else None

    def _evict_ram(self) -> None:
        """Whole states beyond what the RAM budget leaves after the blocks, oldest first."""
        total = sum(e.nbytes for e in self._ram.values()) + self.blocks.ram_bytes()
        while total > self.ram_budget_bytes and self._ram:
            _, oldest = self._ram.popitem(last=False)
            total -= oldest.nbytes

    def _write_loop(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=5.0)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._writer = None
                        return
                continue
            try:
                model_id, slot, tokens, payload, compat, info = job
                seq = info.pop("_seq")
                with self._lock:
                    newer = self._queued_seq.get((model_id, slot), seq) != seq
                if not newer:  # a later save of the same slot supersedes this one
                    self.save(model_id, slot, tokens, payload, compat, info)
                with self._lock:
                    if self._queued_seq.get((model_id, slot)) == seq:
                        del self._queued_seq[(model_id, slot)]
            except Exception:  # noqa: BLE001 - the writer must survive anything
                log.warning("prompt cache write failed", exc_info=True)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Block until every queued disk write is done (CLI exit, tests)."""
        self._queue.join()

    def save(
        self,
        model_id: str,
        slot: Slot,
        tokens: Sequence[int],
        payload: Any,
        compat: dict[str, Any],
        info: dict[str, Any] | None = None,
    ) -> Path | None:
        """Write a state file now (atomic); its path, or None when disk saving is off."""
        if self.write_error is not None:
            return None
        meta = {**(info or {}), "kind": slot.kind, "key": slot.key, "model_id": model_id}
        path = self.path_for(model_id, slot)
        layout = self._layout_for(model_id, compat, payload)
        try:
            ensure_private_dir(self.folder)
            ensure_private_dir(path.parent)
            if layout is not None:
                written = self.blocks.store(model_id, slot.kind, slot.key, tokens, payload, layout, compat,
                                            dict(info or {}), ram=False)
                path.unlink(missing_ok=True)  # the slot's whole state (an older format) is superseded
                assert written is not None
                path = written
            else:
                state_file.write(path, tokens, compat, payload, meta)
                self.blocks.remove_slot(model_id, slot.kind, slot.key, ram=False)
        except OSError as exc:
            self.write_error = f"cannot write {getattr(exc, 'filename', None) or path}: {exc.strerror or exc}"
            return None
        self.evict_disk(keep=path)
        return path

    # -- reading ---------------------------------------------------------
    def _read_file(self, path: Path) -> _Indexed:
        """The file's entry (from the index while the file is the same version:
        device, inode, size and mtime, `_stamp`)."""
        st = path.stat()
        stamp = _stamp(st)
        with self._lock:
            known = self._index.get(path)
        if known is not None and known.stamp == stamp:
            known.entry.last_used = st.st_mtime
            return known
        problem, header = "", None
        model_id, slot, tokens, compat, info = path.parent.name, _slot_of_file(path), [], {}, {}
        try:
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("not a regular file")  # opening a FIFO would block
            with state_file.open_regular(path) as fh:
                st = os.fstat(fh.fileno())  # the file read here, should a save replace it meanwhile
                stamp = _stamp(st)
                header = state_file.read(fh, st.st_size)
            fields = header.fields
            compat = header.compat
            model_id = str(fields.get("model_id", model_id))
            if "kind" not in fields:  # v0.1 wrote persona prefixes only, their tokens in compat
                slot = Slot.persona(str(fields.get("persona_id", path.stem)))
                tokens = list(compat.get("prefix_tokens") or [])
                problem = "v0.1 persona state file (rebuilt on next use)"
            else:
                slot = Slot(str(fields["kind"]), str(fields["key"]))
                tokens, problem = header.tokens, header.problem
            info = {k: v for k, v in fields.items() if k not in ("tokens", "compat")}
        except ValueError as exc:
            problem = str(exc) if "truncated" in str(exc) or "regular" in str(exc) else f"corrupt: {exc}"
        except OSError as exc:
            problem = f"unreadable: {exc.strerror or exc}"
        except (KeyError, TypeError):
            problem = "corrupt header"
        entry = Entry(slot, model_id, tokens, st.st_size, DISK, st.st_mtime, compat, info, path, problem=problem)
        indexed = _Indexed(stamp, entry, header)
        with self._lock:
            self._index[path] = indexed
        return indexed

    def _disk_entries(self, model_id: str | None = None) -> list[_Indexed]:
        if not self.folder.is_dir():
            return []
        suffix = state_file.SUFFIX
        pattern = f"{_safe_name(model_id)}/*{suffix}" if model_id is not None else f"*/*{suffix}"
        found = []
        for path in sorted(self.folder.glob(pattern)):
            try:
                found.append(self._read_file(path))
            except FileNotFoundError:  # evicted or replaced meanwhile
                continue
        with self._lock:  # forget files that are gone
            for path in [p for p in self._index if not p.exists()]:
                del self._index[path]
        return found

    def _chain_entries(self, model_id: str | None) -> list[Entry]:
        """The block tier's chains as entries, RAM then disk."""
        found: list[Entry] = []
        for chain in [*self.blocks.ram_chains(model_id), *self.blocks.disk_chains(model_id)]:
            problem = chain.problem if isinstance(chain, BadRecord) else ""
            try:
                slot = Slot(chain.kind, chain.key)
            except ValueError:
                slot, problem = _slot_of_file(chain.path) if chain.path else Slot.persona("?"), \
                    problem or "corrupt chain record (slot kind)"
            if problem or isinstance(chain, BadRecord):
                path = chain.path
                assert path is not None
                try:
                    st = path.stat()
                except OSError:
                    continue
                found.append(Entry(slot, chain.model_id, [], st.st_size, DISK, st.st_mtime, {}, {}, path,
                                   problem=problem))
                continue
            found.append(Entry(slot, chain.model_id, chain.tokens, self.blocks.chain_bytes(chain), chain.tier,
                               chain.last_used, chain.compat, chain.info, chain.path, chain=chain))
        return found

    def entries(self, model_id: str | None = None) -> list[Entry]:
        """Every entry, RAM and disk (most recently used first)."""
        with self._lock:
            ram = [e for (m, _), e in self._ram.items() if model_id is None or m == model_id]
        disk = [i.entry for i in self._disk_entries(model_id)]
        return sorted(ram + disk + self._chain_entries(model_id), key=lambda e: -e.last_used)

    def usage(self) -> list[ModelUsage]:
        """Per model on disk: bytes per token, blocks, bytes, shared bytes."""
        return self.blocks.usage()

    def lookup(
        self,
        model_id: str,
        compat: dict[str, Any],
        prompt: Sequence[int],
        min_shared: int = 1,
        expect: Sequence[Slot] = (),
    ) -> Lookup:
        """Usable entries sharing >= `min_shared` tokens with `prompt`, best first."""
        limit = max(len(prompt) - 1, 0)
        candidates: list[tuple[int, int, int, Candidate]] = []
        misses: list[str] = []
        seen: set[Slot] = set()
        with self._lock:
            ram = list(self._ram.values())
        disk = [i.entry for i in self._disk_entries()]
        chains = self._chain_entries(None)
        ram += [e for e in chains if e.tier == RAM]
        disk += [e for e in chains if e.tier == DISK]
        blocks_on_disk: dict[str, set[str]] = {}  # per model, read once it is needed
        for rank, entry in [(0, e) for e in ram] + [(1, e) for e in disk]:
            own = entry.model_id == model_id
            label = f"{entry.slot.label} ({entry.tier})"
            if not own and (entry.problem or entry.compat != compat):
                continue  # another model's entry, fine for it: not a miss of this one
            if entry.problem:
                misses.append(f"{label}: {entry.problem}")
                continue
            difference = _first_difference(entry.compat, compat)
            if difference is not None:
                misses.append(_compat_miss(label, difference))
                continue
            rank += 0 if own else 2  # the same prefix from this model's own entry first
            shared = min(common_prefix_len(entry.tokens, prompt), limit)
            if own:
                seen.add(entry.slot)
            if own and entry.slot in expect and shared < len(entry.tokens) and shared < limit:
                # Not a fault: the state is of another version of the
                # conversation (an edit, another branch, a fork of one), or
                # a reply's text was tokenized again (stored before its
                # sampled tokens were, or a template that changes it).
                why = ("holds another version of the conversation (an edit, a branch, a fork, "
                       "or a reply tokenized again from its text): "
                       f"shares {shared:,} of its {len(entry.tokens):,} tokens with this prompt")
                in_ram = f"{entry.slot.label} ({RAM}): {why}"
                if entry.tier == DISK and in_ram in misses:  # the same state in both tiers: one line
                    misses[misses.index(in_ram)] = f"{entry.slot.label} ({RAM}, {DISK}): {why}"
                else:
                    misses.append(f"{label}: {why}")
            if entry.chain is not None:
                if entry.tier == DISK and entry.model_id not in blocks_on_disk:
                    blocks_on_disk[entry.model_id] = self.blocks.disk_block_keys(entry.model_id)
                present = self.blocks.present(entry.chain,
                                              blocks_on_disk[entry.model_id] if entry.tier == DISK else None)
                if present < shared:
                    if own:
                        misses.append(f"{label}: blocks evicted after {present:,} of {len(entry.tokens):,} tokens")
                    shared = present
            if shared >= max(min_shared, 1):
                seen.add(entry.slot)
                candidates.append((-shared, rank, len(entry.tokens), Candidate(entry, shared)))
        for slot in expect:
            if slot not in seen and not any(m.startswith(slot.label + " ") for m in misses):
                misses.append(f"{slot.label}: no saved state (not kept yet, or removed)")
        candidates.sort(key=lambda c: c[:3])
        return Lookup([c[3] for c in candidates], misses)

    def reserve(self, model_id: str, slot: Slot) -> int:
        """Make the memory a restore of the slot's chain assembles into ready
        now (`BlockStore.reserve`), for a thread while other work goes on;
        best effort: 0 bytes when there is no such chain or no memory for it."""
        try:
            return self.blocks.reserve(model_id, slot.kind, slot.key)
        except MemoryError:
            log.info("prompt cache: no memory to reserve for %s of %s", slot.label, model_id)
            return 0

    def open(self, candidate: Candidate) -> OpenedState | Miss:
        """The candidate's payload, ready for `kv_state.restore`.

        A disk entry's header was parsed when it was indexed (`lookup`), and its
        compat checked there: the file is not parsed again, but it must still be
        that file, unchanged (`_stamp`), else the candidate is a miss."""
        entry = candidate.entry
        if entry.chain is not None:
            built = self.blocks.assemble(entry.chain, candidate.shared)
            if isinstance(built, str):
                return Miss(f"{entry.slot.label} ({entry.tier}): {built}")
            return OpenedState(entry.tokens[: candidate.shared], built.payload, built.verify, built.close)
        if entry.tier == RAM:
            with self._lock:
                key = (entry.model_id, entry.slot)
                if self._ram.get(key) is entry:
                    self._ram.move_to_end(key)
                    entry.last_used = time.time()
            return OpenedState(entry.tokens, entry.payload, None)
        path = entry.path
        assert path is not None
        label = f"{entry.slot.label} (disk)"
        try:
            fh = state_file.open_regular(path)
        except FileNotFoundError:
            return Miss(f"{label}: missing (removed meanwhile)")
        except ValueError as exc:
            return Miss(f"{label}: {exc}")
        except OSError as exc:
            return Miss(f"{label}: unreadable: {exc.strerror or exc}")
        with fh:
            with self._lock:
                indexed = self._index.get(path)
            if indexed is None or indexed.entry is not entry or indexed.stamp != _stamp(os.fstat(fh.fileno())):
                return Miss(f"{label}: replaced on disk since the lookup")
            assert indexed.header is not None  # an entry without a problem was read from one
            try:
                mapped = state_file.map_payload(fh, indexed.header)
            except (OSError, ValueError) as exc:
                return Miss(f"{label}: unreadable: {exc}")
            try:
                os.utime(fh.fileno())  # last used, for LRU eviction
                st = os.fstat(fh.fileno())
            except OSError:
                pass
            else:
                # Touched, not changed (chatterm never writes a state file in
                # place): the next lookup keeps the parsed header.
                with self._lock:
                    indexed.stamp = _stamp(st)
                entry.last_used = st.st_mtime
        return OpenedState(entry.tokens, mapped.payload, mapped.verify, mapped.close)

    def clear_ram(self) -> None:
        """Drop the RAM tier (benchmarks measure restores from disk)."""
        with self._lock:
            self._ram.clear()
        self.blocks.clear_ram()

    def discard(self, entry: Entry, reason: str) -> None:
        """Drop an entry that failed to restore, so the next save rebuilds it."""
        if entry.chain is not None:
            self.blocks.drop_chain(entry.chain, reason)
            return
        log.info("prompt cache: dropping %s (%s): %s", entry.slot.label, entry.tier, reason)
        if entry.tier == RAM:
            with self._lock:
                if self._ram.get((entry.model_id, entry.slot)) is entry:
                    del self._ram[(entry.model_id, entry.slot)]
            return
        if entry.path is not None:
            try:
                entry.path.unlink()
            except OSError:
                pass

    # -- housekeeping ----------------------------------------------------
    def evict_disk(self, keep: Path | None = None) -> list[Path]:
        """Fit the disk budget: whole-state files first, least recently used
        first, then blocks (`BlockStore.evict_disk`). The whole-state files removed."""
        for pattern in _STATE_TEMP_FILES:
            sweep_temp_files(self.folder, pattern)
        entries = sorted((i.entry for i in self._disk_entries()), key=lambda e: e.last_used)
        total = sum(e.nbytes for e in entries)
        blocks = self.blocks.disk_bytes()
        removed: list[Path] = []
        for entry in entries:
            if total + blocks <= self.disk_budget_bytes:
                break
            if entry.path == keep or entry.path is None:
                continue
            try:
                entry.path.unlink()
            except OSError:
                continue
            total -= entry.nbytes
            removed.append(entry.path)
        self.blocks.evict_disk(max(self.disk_budget_bytes - total, 0))
        return removed

    def clear(self, kind: str | None = None, key: str | None = None) -> int:
        """Remove entries (RAM and disk) of one kind and/or one key; all by default."""
        def matches(slot: Slot) -> bool:
            return slot.is_of(kind, key)

        with self._lock:
            gone = [k for k, e in self._ram.items() if matches(e.slot)]
            for k in gone:
                del self._ram[k]
        if kind is None and key is None:
            for pattern in _STATE_TEMP_FILES:
                sweep_temp_files(self.folder, pattern, older_than_s=60.0)
        count = len(gone) + self.blocks.clear(lambda k, s: matches(Slot(k, s) if k in KINDS else Slot.persona(s)),
                                              everything=kind is None and key is None)
        for indexed in self._disk_entries():
            if matches(indexed.entry.slot) and indexed.entry.path is not None:
                try:
                    indexed.entry.path.unlink()
                    count += 1
                except OSError:
                    pass
        return count

    def verify_files(self) -> list[FileCheck]:
        """Check every state file: header, size, payload sha256 and chunk CRC-32s."""
        results = []
        for indexed in self._disk_entries():
            entry = indexed.entry
            path = entry.path
            assert path is not None
            label = f"{entry.slot.label} · {entry.model_id}"
            if entry.problem:
                results.append(FileCheck(path, label, False, entry.problem))
                continue
            assert indexed.header is not None  # an entry without a problem was read from one
            try:
                with state_file.open_regular(path) as fh:
                    problem = state_file.check_payload(fh, indexed.header)
            except (OSError, ValueError) as exc:
                results.append(FileCheck(path, label, False, f"unreadable: {getattr(exc, 'strerror', None) or exc}"))
                continue
            if problem is not None:
                results.append(FileCheck(path, label, False, problem))
            else:
                results.append(FileCheck(path, label, True, f"{len(entry.tokens):,} tokens, {entry.nbytes:,} bytes"))
        results += self.blocks.verify()
        return results
