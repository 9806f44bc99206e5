"""The block tier of the prompt cache: KV states kept as chains of shared blocks,
in RAM and on disk.

Contract:
- A state of N tokens is a `Chain`: its tokens and segments, each segment a
  block (`chatterm.core.cache.block_file`) and how many of its first tokens it
  uses. Blocks hold at most `block_tokens` tokens (DEFAULT_BLOCK_TOKENS).
- `store(...)` keeps a state under a slot (kind, key) of a model, replacing
  that slot's chain. It shares every block it can with the known chain (RAM
  or disk, same model and compat) sharing the most leading tokens: a
  session's chain starts with its persona's blocks, a turn's chain with the
  previous turn's, a fork's with its parent's. Only the tokens after that are
  cut from the payload (`state_layout.split`) into new blocks; on disk a turn
  writes those blocks and one small chain record. OSError when a disk write
  fails (the RAM tier is kept).
- Tiers. RAM: blocks in memory, budget `ram_budget_bytes`. Disk:
  `<folder>/<model>/blocks/<key>.kvblock` and `<folder>/<model>/<kind>-<key>.kvchain`,
  budget given to `evict_disk`. Both evict by block, least recently used
  first, and never a block that a kept block after it in some chain needs:
  eviction shortens chains from their end; a chain left with nothing is
  dropped. A chain is usable up to its first absent block (`present`).
- `assemble(chain, n)` builds the blob of the chain's first n tokens in memory
  (`state_layout.join`). A disk block is checked against the chain first (its
  file name, prev key, start, tokens, layout); one that fails is a miss with
  its reason and is deleted, so the next save rebuilds it. The CRC-32s are
  checked by `Assembled.verify`, meant to run while llama.cpp copies.
  Assembly writes into one kept buffer; `reserve(model, kind, key)` grows it
  ahead of a restore that is coming (a resumed session, while the model
  loads), so that restore does not wait for fresh memory; an assembly that
  starts while it does waits for it instead of allocating a second buffer.
- `usage()` sums, per model, the disk blocks: count, bytes, bytes per token,
  and the bytes of blocks used by more than one chain. `verify()` checks every
  block (sha256 and CRC-32) and chain record.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from chatterm.core.cache import block_file, state_layout
from chatterm.core.cache.block_file import BlockError, chain_key, root_key
from chatterm.core.cache.state_layout import Frame, Layout, LayoutError
from chatterm.core.cache.tokens import common_prefix_len
from chatterm.core.metrics.format import counted
from chatterm.core.system.atomic import ensure_private_dir

log = logging.getLogger(__name__)

DEFAULT_BLOCK_TOKENS = 128
"""Tokens per block (see docs/kv-blocks.md for the measurement)."""
SCRATCH_HEADROOM = 4
"""A new assembly buffer is a 1/4 larger than the restore that needs it."""
RAM, DISK = "ram", "disk"
BLOCKS_DIR = "blocks"


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


@dataclass
class Chain:
    model_id: str
    kind: str
    key: str
    compat: dict[str, Any]
    frame: Frame
    tokens: list[int]
    segments: list[tuple[str, int]]
    """(block key, tokens of it used), in order; the used counts sum to len(tokens)."""
    info: dict[str, Any]
    tier: str
    last_used: float
    path: Path | None = None
    """The chain record (disk)."""
    root: str = field(init=False)

    def __post_init__(self) -> None:
        self.root = root_key(self.compat, self.frame.digest)

    def starts(self) -> list[int]:
        out, at = [], 0
        for _, used in self.segments:
            out.append(at)
            at += used
        return out


@dataclass
class _RamBlock:
    prev: str
    start: int
    tokens: list[int]
    piece: bytearray
    last_used: float


@dataclass
class BadRecord:
    path: Path
    model_id: str
    kind: str
    key: str
    problem: str


@dataclass
class Assembled:
    payload: bytearray
    verify: Callable[[], bool] | None
    close: Callable[[], None]


@dataclass(frozen=True)
class ModelUsage:
    model_id: str
    bytes_per_token: int
    blocks: int
    bytes: int
    shared_bytes: int
    """Bytes of blocks that more than one chain uses (stored once)."""
    chains: int


@dataclass(frozen=True)
class FileCheck:
    """One file's verdict in `verify`: a chain record, a block or a whole-state file."""
    path: Path
    label: str
    ok: bool
    detail: str
    block: bool = False
    """A block file (of which a cache holds many; `cache verify` counts them)."""


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class BlockStore:
    def __init__(self, folder: Path, ram_budget_bytes: int, block_tokens: int = DEFAULT_BLOCK_TOKENS):
        self.folder = folder
        self.ram_budget_bytes = ram_budget_bytes
        self.block_tokens = block_tokens
        self._lock = threading.RLock()
        self._ram_blocks: dict[tuple[str, str], _RamBlock] = {}
        self._ram_chains: dict[tuple[str, str, str], Chain] = {}
        self._records: dict[Path, tuple[tuple[int, int, int, int], Chain | BadRecord]] = {}
        self._scratch = bytearray()
        """The assembly buffer, reused and kept (clear_ram too): fresh memory
        costs more than the copy into it. 69 MiB of it took 50-220 ms to fault
        in on the 2-core VM, where memory the guest never touched is slowest;
        the join into a warm buffer took 12 ms."""
        self._scratch_busy = False
        self._scratch_ready = threading.Condition(self._lock)
        """Notified when `reserve` has grown the buffer."""
        self._reserving = False

    # -- paths -----------------------------------------------------------
    def record_path(self, model_id: str, kind: str, key: str) -> Path:
        return self.folder / safe_name(model_id) / f"{kind}-{safe_name(key)}{block_file.RECORD_SUFFIX}"

    def block_path(self, model_id: str, key: str) -> Path:
        return self.folder / safe_name(model_id) / BLOCKS_DIR / f"{key}{block_file.BLOCK_SUFFIX}"

    # -- reading ---------------------------------------------------------
    def ram_chains(self, model_id: str | None = None) -> list[Chain]:
        with self._lock:
            return [c for c in self._ram_chains.values() if model_id is None or c.model_id == model_id]

    def disk_chains(self, model_id: str | None = None) -> list[Chain | BadRecord]:
        """Every chain record on disk (parsed once per version of its file)."""
        if not self.folder.is_dir():
            return []
        pattern = f"{safe_name(model_id)}/*{block_file.RECORD_SUFFIX}" if model_id is not None \
            else f"*/*{block_file.RECORD_SUFFIX}"
        found: list[Chain | BadRecord] = []
        paths = sorted(self.folder.glob(pattern))
        listed = set(paths)
        for path in paths:
            try:
                found.append(self._read_record(path))
            except FileNotFoundError:
                continue
        with self._lock:
            for gone in [p for p in self._records if p not in listed and not p.exists()]:
                del self._records[gone]
        return found

    def _touch_record(self, chain: Chain, path: Path) -> None:
        """The record's time is the chain's "last used" (`cache ls`; its blocks,
        touched as they are read, are what eviction goes by). Touched, not
        changed: the parsed record stays the one known, not parsed again."""
        try:
            os.utime(path)
            st = path.stat()
        except OSError:
            return
        with self._lock:
            known = self._records.get(path)
            if known is not None and known[1] is chain:
                self._records[path] = (_stamp(st), chain)
        chain.last_used = st.st_mtime

    def _read_record(self, path: Path) -> Chain | BadRecord:
        st = path.stat()
        with self._lock:
            known = self._records.get(path)
        if known is not None and known[0] == _stamp(st):
            if isinstance(known[1], Chain):
                known[1].last_used = max(known[1].last_used, st.st_mtime)
            return known[1]
        kind, _, key = path.stem.partition("-")
        parsed: Chain | BadRecord
        try:
            record = block_file.read_record(path)
            parsed = Chain(record.model_id or path.parent.name, record.kind, record.key, record.compat,
                           Frame.from_json(record.frame), record.tokens, record.segments, record.info,
                           DISK, st.st_mtime, path)
        except (BlockError, LayoutError) as exc:
            parsed = BadRecord(path, path.parent.name, kind, key, str(exc))
        except OSError as exc:
            parsed = BadRecord(path, path.parent.name, kind, key, f"unreadable: {exc.strerror or exc}")
        with self._lock:
            self._records[path] = (_stamp(st), parsed)
        return parsed

    def _disk_block_names(self, model_id: str) -> dict[str, os.stat_result]:
        folder = self.folder / safe_name(model_id) / BLOCKS_DIR
        names: dict[str, os.stat_result] = {}
        try:
            with os.scandir(folder) as it:
                for item in it:
                    if item.name.endswith(block_file.BLOCK_SUFFIX) and not item.name.startswith("."):
                        try:
                            names[item.name[: -len(block_file.BLOCK_SUFFIX)]] = item.stat()
                        except OSError:
                            continue
        except OSError:
            pass
        return names

    def disk_block_keys(self, model_id: str) -> set[str]:
        """The keys of the model's block files (names only: no stat)."""
        try:
            names = os.listdir(self.folder / safe_name(model_id) / BLOCKS_DIR)
        except OSError:
            return set()
        suffix = block_file.BLOCK_SUFFIX
        return {n[: -len(suffix)] for n in names if n.endswith(suffix) and not n.startswith(".")}

    def present(self, chain: Chain, blocks: Iterable[str] | None = None) -> int:
        """Leading tokens of `chain` whose blocks are in its tier (`blocks`: the
        disk block keys, when the caller has listed them)."""
        if chain.tier == RAM:
            with self._lock:
                have = {k for (m, k) in self._ram_blocks if m == chain.model_id}
        else:
            have = set(blocks) if blocks is not None else self.disk_block_keys(chain.model_id)
        at = 0
        for key, used in chain.segments:
            if key not in have:
                break
            at += used
        return at

    def chain_bytes(self, chain: Chain) -> int:
        return sum(used for _, used in chain.segments) * chain.frame.bytes_per_token

    # -- storing ---------------------------------------------------------
    def store(
        self,
        model_id: str,
        kind: str,
        key: str,
        tokens: Sequence[int],
        payload: Any,
        layout: Layout,
        compat: dict[str, Any],
        info: dict[str, Any],
        ram: bool = True,
        disk: bool = True,
    ) -> Path | None:
        """Keep the state of `tokens` as the slot's chain in RAM and/or on disk;
        the chain record's path when written. OSError when the disk write fails."""
        tokens = list(tokens)
        frame = layout.frame
        root = root_key(compat, frame.digest)
        plan = self._plan(model_id, root, tokens)
        now = time.time()
        ram = ram and self.ram_budget_bytes > 0
        with self._lock:
            ram_have = {k for (m, k) in self._ram_blocks if m == model_id}
        ram_segments, ram_missing = self._fill(plan, tokens, ram_have) if ram else ([], [])
        disk_have = self.disk_block_keys(model_id) if disk else set()
        disk_segments, disk_missing = self._fill(plan, tokens, disk_have) if disk else ([], [])
        with self._lock:  # a block the RAM tier holds is written from there: no second copy of it
            pieces = {(s, s + t): self._ram_blocks[(model_id, k)].piece
                      for s, t, _, k in disk_missing if (model_id, k) in self._ram_blocks}
        ranges = sorted({(s, s + t) for s, t, _, _ in ram_missing + disk_missing} - pieces.keys())
        if ranges:
            pieces |= dict(zip(ranges, state_layout.split(payload, layout, ranges), strict=True))
        if ram:
            with self._lock:
                for start, take, prev, bkey in ram_missing:
                    self._ram_blocks[(model_id, bkey)] = _RamBlock(prev, start, tokens[start : start + take],
                                                                  pieces[(start, start + take)], now)
                chain = Chain(model_id, kind, key, compat, frame, tokens, ram_segments, dict(info), RAM, now)
                self._ram_chains[(model_id, kind, key)] = chain
                self._touch_ram(chain, len(tokens), now)
                self._evict_ram()
        if not disk:
            return None
        folder = self.folder / safe_name(model_id)
        ensure_private_dir(self.folder)
        ensure_private_dir(folder)
        ensure_private_dir(folder / BLOCKS_DIR)
        for start, take, prev, bkey in disk_missing:
            block_file.write_block(self.block_path(model_id, bkey), bkey, prev, start,
                                   tokens[start : start + take], frame.digest, pieces[(start, start + take)])
        for bkey, _ in disk_segments:  # shared blocks were just used: last in line for eviction
            try:
                os.utime(self.block_path(model_id, bkey))
            except OSError:
                pass
        path = self.record_path(model_id, kind, key)
        block_file.write_record(path, block_file.Record(
            kind, key, model_id, compat, frame.to_json(), tokens, disk_segments, dict(info)))
        return path

    def _plan(self, model_id: str, root: str, tokens: list[int]) -> list[tuple[int, int, str, str | None]]:
        """(start, tokens, prev key, block to share or None) of each segment of the new chain."""
        best: Chain | None = None
        shared = 0
        chains: list[Chain | BadRecord] = [*self.ram_chains(model_id), *self.disk_chains(model_id)]
        for chain in chains:
            if isinstance(chain, Chain) and chain.root == root:
                n = common_prefix_len(chain.tokens, tokens)
                if n > shared:
                    best, shared = chain, n
        plan: list[tuple[int, int, str, str | None]] = []
        prev, at = root, 0
        if best is not None:
            for (bkey, used), start in zip(best.segments, best.starts(), strict=True):
                if start >= shared:
                    break
                take = min(used, shared - start)
                plan.append((start, take, prev, bkey))
                prev = chain_key(prev, tokens[start : start + take])
                at = start + take
        while at < len(tokens):
            take = min(self.block_tokens, len(tokens) - at)
            plan.append((at, take, prev, None))
            prev = chain_key(prev, tokens[at : at + take])
            at += take
        return plan

    @staticmethod
    def _fill(plan, tokens, have: set[str]) -> tuple[list[tuple[str, int]], list[tuple[int, int, str, str]]]:
        """The segments of a tier, and the blocks it lacks: (start, tokens, prev, key).
        A shared block the tier lacks is replaced by a block of exactly the tokens used."""
        segments, missing = [], []
        for start, take, prev, shared in plan:
            exact = chain_key(prev, tokens[start : start + take])
            if shared is not None and shared in have:
                segments.append((shared, take))
            else:
                segments.append((exact, take))
                if exact not in have:
                    missing.append((start, take, prev, exact))
        return segments, missing

    # -- RAM eviction ----------------------------------------------------
    def _touch_ram(self, chain: Chain, n: int, now: float) -> None:
        for (bkey, _), start in zip(chain.segments, chain.starts(), strict=True):
            if start >= n:
                break
            block = self._ram_blocks.get((chain.model_id, bkey))
            if block is not None:
                block.last_used = now

    def _evict_ram(self) -> None:
        total = sum(len(b.piece) for b in self._ram_blocks.values())
        while total > self.ram_budget_bytes and self._ram_blocks:
            needed: set[tuple[str, str]] = set()
            for chain in self._ram_chains.values():
                kept = []
                for bkey, _ in chain.segments:
                    if (chain.model_id, bkey) not in self._ram_blocks:
                        break
                    kept.append((chain.model_id, bkey))
                needed.update(kept[:-1])
            victims = [k for k in self._ram_blocks if k not in needed]
            if not victims:
                break
            victim = min(victims, key=lambda k: self._ram_blocks[k].last_used)
            total -= len(self._ram_blocks.pop(victim).piece)
        for ckey, chain in list(self._ram_chains.items()):
            if self.present(chain) == 0:
                del self._ram_chains[ckey]

    def ram_bytes(self) -> int:
        with self._lock:
            return sum(len(b.piece) for b in self._ram_blocks.values())

    def clear_ram(self) -> None:
        """Drop the RAM blocks and chains; the assembly buffer is working memory
        that any restore reuses, not cached state, so it stays."""
        with self._lock:
            self._ram_blocks.clear()
            self._ram_chains.clear()

    # -- disk eviction ---------------------------------------------------
    def disk_bytes(self) -> int:
        total = 0
        for model in self._model_dirs():
            total += sum(st.st_size for st in self._disk_block_names(model.name).values())
        return total

    def _model_dirs(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir() if p.is_dir() and not p.name.startswith("."))

    def evict_disk(self, budget_bytes: int) -> int:
        """Delete least-recently-used disk blocks (never one a kept later block
        of a chain needs) until they fit `budget_bytes`; chain records left
        with no block go too. How many blocks were deleted."""
        files: dict[tuple[str, str], os.stat_result] = {}
        chains: list[tuple[str, Chain]] = []
        records: list[Path] = []
        for model in self._model_dirs():
            for bkey, st in self._disk_block_names(model.name).items():
                files[(model.name, bkey)] = st
            for chain in self.disk_chains(model.name):
                if isinstance(chain, Chain):
                    chains.append((model.name, chain))
        total = sum(st.st_size for st in files.values())
        removed = 0
        while total > budget_bytes and files:
            needed: set[tuple[str, str]] = set()
            for model, chain in chains:
                kept = []
                for bkey, _ in chain.segments:
                    if (model, bkey) not in files:
                        break
                    kept.append((model, bkey))
                needed.update(kept[:-1])
            victims = [k for k in files if k not in needed]
            if not victims:
                break
            victim = min(victims, key=lambda k: files[k].st_mtime)
            try:
                (self.folder / victim[0] / BLOCKS_DIR / f"{victim[1]}{block_file.BLOCK_SUFFIX}").unlink()
            except FileNotFoundError:
                pass
            except OSError:
                break
            total -= files.pop(victim).st_size
            removed += 1
        if removed:
            for model, chain in chains:
                if chain.path is not None and not any((model, k) in files for k, _ in chain.segments[:1]):
                    records.append(chain.path)
            for path in records:
                try:
                    path.unlink()
                except OSError:
                    pass
        return removed

    # -- assembling ------------------------------------------------------
    def assemble(self, chain: Chain, n: int) -> Assembled | str:
        """The blob of the chain's first `n` tokens, or why not (one line)."""
        pieces: list[Any] = []
        counts: list[int] = []
        takes: list[int] = []
        mapped: list[block_file.MappedBlock] = []

        def close() -> None:
            pieces.clear()
            for block in mapped:
                block.close()

        prev, now = chain.root, time.time()
        try:
            for (bkey, used), start in zip(chain.segments, chain.starts(), strict=True):
                if start >= n:
                    break
                take = min(used, n - start)
                want = chain.tokens[start : start + take]
                if chain.tier == RAM:
                    with self._lock:
                        block = self._ram_blocks.get((chain.model_id, bkey))
                        if block is not None:
                            block.last_used = now
                    if block is None:
                        return f"block {bkey[:12]} evicted from RAM"
                    block_prev, block_start, block_tokens, piece = block.prev, block.start, block.tokens, block.piece
                    frame_digest = chain.frame.digest
                else:
                    path = self.block_path(chain.model_id, bkey)
                    try:
                        mb = block_file.read_block(path, bkey)
                    except FileNotFoundError:
                        return f"block {bkey[:12]} missing (evicted or removed)"
                    except BlockError as exc:
                        self._delete(path)
                        return f"block {bkey[:12]}: {exc}"
                    mapped.append(mb)
                    header = mb.header
                    block_prev, block_start, block_tokens, piece = header.prev, header.start, header.tokens, mb.payload
                    frame_digest = header.frame
                    try:
                        os.utime(path)
                    except OSError:
                        pass
                if (block_prev != prev or block_start != start or block_tokens[:take] != want
                        or frame_digest != chain.frame.digest):
                    if chain.tier == DISK:
                        self._delete(self.block_path(chain.model_id, bkey))
                    return f"block {bkey[:12]}: foreign block (not this chain's tokens or layout)"
                if memoryview(piece).nbytes != len(block_tokens) * chain.frame.bytes_per_token:
                    return f"block {bkey[:12]}: its size does not match its tokens"
                pieces.append(piece)
                counts.append(len(block_tokens))
                takes.append(take)
                prev = chain_key(prev, want)
            size = chain.frame.blob_size(sum(takes))
            out, release = self._buffer(size)
            try:
                state_layout.join(chain.frame, pieces, counts, takes, out=out)
            except LayoutError as exc:
                release()
                return f"blocks do not fit the chain's layout: {exc}"
        except BaseException:
            close()
            raise
        if chain.tier == RAM:
            close()
            return Assembled(out, None, release)
        if chain.path is not None:
            self._touch_record(chain, chain.path)
        blocks = list(mapped)

        def verify() -> bool:
            with ThreadPoolExecutor(max_workers=max(os.cpu_count() or 1, 1)) as pool:
                return all(pool.map(lambda b: b.header.crc_ok(b.payload), blocks))

        def close_all() -> None:
            close()
            release()

        return Assembled(out, verify, close_all)

    def _scratch_size(self, size: int) -> int:
        # With room to grow: a conversation restored again a few turns later
        # is a little longer, and would fault in a new buffer.
        return min(size + size // SCRATCH_HEADROOM, self.ram_budget_bytes)

    def reserve(self, model_id: str, kind: str, key: str) -> int:
        """Grow the assembly buffer to the size of the slot's disk chain, now
        (a thread's work: it takes as long as faulting that memory in); the
        bytes it holds after, 0 when there is no such chain."""
        try:
            chain = self._read_record(self.record_path(model_id, kind, key))
        except OSError:
            return 0
        if not isinstance(chain, Chain):
            return 0
        size = chain.frame.blob_size(sum(used for _, used in chain.segments))
        with self._lock:
            if self._reserving or self._scratch_busy or size > max(self.ram_budget_bytes, 0):
                return 0
            if len(self._scratch) >= size:
                return len(self._scratch)
            self._reserving = True
        grown = bytearray()
        try:
            grown = bytearray(self._scratch_size(size))  # faulted in off the lock
        finally:
            with self._lock:
                self._reserving = False
                if len(grown) > len(self._scratch):
                    self._scratch = grown
                self._scratch_ready.notify_all()
        return len(grown)

    def _buffer(self, size: int) -> tuple[Any, Callable[[], None]]:
        """A writable buffer of `size` bytes and how to give it back: the reused
        scratch buffer when it is free and fits the RAM budget, else a new one."""
        with self._lock:
            if size > max(self.ram_budget_bytes, 0):
                return bytearray(size), lambda: None
            while self._reserving:  # it is being grown for this restore: as fast as a new one
                self._scratch_ready.wait()
            if self._scratch_busy:
                return bytearray(size), lambda: None
            if len(self._scratch) < size:
                self._scratch = bytearray(self._scratch_size(size))
            self._scratch_busy = True
            view = memoryview(self._scratch)[:size]

        def release() -> None:
            view.release()
            with self._lock:
                self._scratch_busy = False

        return view, release

    @staticmethod
    def _delete(path: Path) -> bool:
        """Whether `path` is gone now (a read-only folder, or a folder in its place, keeps it)."""
        try:
            path.unlink()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def drop_chain(self, chain: Chain, reason: str) -> None:
        """Forget a chain that failed to restore; a disk chain's blocks whose
        CRC-32 fails are deleted too (the next save rebuilds them)."""
        log.info("prompt cache: dropping %s %s (%s): %s", chain.kind, chain.key, chain.tier, reason)
        if chain.tier == RAM:
            with self._lock:
                if self._ram_chains.get((chain.model_id, chain.kind, chain.key)) is chain:
                    del self._ram_chains[(chain.model_id, chain.kind, chain.key)]
            return
        for bkey, _ in chain.segments:
            path = self.block_path(chain.model_id, bkey)
            try:
                _, problem = block_file.check_block(path, bkey)
            except FileNotFoundError:
                continue
            except BlockError:
                problem = "bad"
            if problem is not None:
                self._delete(path)
        if chain.path is not None:
            self._delete(chain.path)

    def forget_ram(self, model_id: str, kind: str, key: str) -> None:
        with self._lock:
            self._ram_chains.pop((model_id, kind, key), None)

    def remove_slot(self, model_id: str, kind: str, key: str, ram: bool = True) -> None:
        """Drop the slot's chain (its blocks stay for other chains, and for eviction)."""
        if ram:
            self.forget_ram(model_id, kind, key)
        self._delete(self.record_path(model_id, kind, key))

    def clear(self, matches: Callable[[str, str], bool], everything: bool) -> int:
        """Remove the chains whose (kind, key) match, in both tiers; blocks no
        remaining chain uses go too (all of them when `everything`). How many
        chains were removed."""
        count = 0
        with self._lock:
            for ckey in [k for k, c in self._ram_chains.items() if matches(c.kind, c.key)]:
                del self._ram_chains[ckey]
                count += 1
            if everything:
                self._ram_blocks.clear()
        for model in self._model_dirs():
            kept: set[str] = set()
            for chain in self.disk_chains(model.name):
                if matches(chain.kind, chain.key):
                    path = chain.path
                    if path is not None and self._delete(path):
                        count += 1
                elif isinstance(chain, Chain):
                    kept.update(k for k, _ in chain.segments)
            for bkey in self._disk_block_names(model.name):
                if everything or bkey not in kept:
                    self._delete(self.block_path(model.name, bkey))
        return count

    # -- reporting -------------------------------------------------------
    def usage(self) -> list[ModelUsage]:
        out = []
        for model in self._model_dirs():
            files = self._disk_block_names(model.name)
            chains = [c for c in self.disk_chains(model.name) if isinstance(c, Chain)]
            users: dict[str, int] = {}
            for chain in chains:
                for bkey in {k for k, _ in chain.segments}:
                    users[bkey] = users.get(bkey, 0) + 1
            if not files and not chains:
                continue
            bpt = chains[0].frame.bytes_per_token if chains else 0
            shared = sum(st.st_size for k, st in files.items() if users.get(k, 0) > 1)
            out.append(ModelUsage(model.name, bpt, len(files), sum(st.st_size for st in files.values()),
                                  shared, len(chains)))
        return out

    def verify(self) -> list[FileCheck]:
        """Check every chain record and every block file (sha256 and CRC-32)."""
        results = []
        for model in self._model_dirs():
            files = self._disk_block_names(model.name)
            for chain in self.disk_chains(model.name):
                label = f"{chain.kind} {chain.key} · {model.name}"
                if isinstance(chain, BadRecord):
                    results.append(FileCheck(chain.path, label, False, chain.problem))
                    continue
                assert chain.path is not None
                present = self.present(chain, files)
                n = len(chain.segments)
                detail = f"{len(chain.tokens):,} tokens in {counted(n, 'block')}"
                if present < len(chain.tokens):
                    detail += f" ({present:,} tokens present, the rest evicted)"
                results.append(FileCheck(chain.path, label, True, detail))
            for bkey in sorted(files):
                path = self.block_path(model.name, bkey)
                label = f"block {bkey[:12]} · {model.name}"
                try:
                    header, problem = block_file.check_block(path, bkey)
                except FileNotFoundError:
                    continue
                except BlockError as exc:
                    results.append(FileCheck(path, label, False, str(exc), block=True))
                    continue
                if problem is not None:
                    results.append(FileCheck(path, label, False, problem, block=True))
                else:
                    detail = f"{len(header.tokens):,} tokens, {header.payload_len:,} bytes"
                    results.append(FileCheck(path, label, True, detail, block=True))
        return results
