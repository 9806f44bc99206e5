"""Which sessions a running chatterm has open, so that another one (the TUI in
a second terminal, `chatterm sessions delete`) does not delete one under it.

Contract:
- `SessionHolds(store_path)` marks at most one session as open by its owner:
  `hold(session_id, holder)` marks it (and unmarks the one held before; None
  marks none) for `holder` (whoever asked: a conversation, the TUI), and
  with `only_if_holder` only while `holder` is the one that asked last (a
  conversation whose late first turn creates its session must not take the
  mark from the session the user opened since). `release()` unmarks. A mark
  is a shared `flock` on the empty file `<store>-open/<id>`, beside SQLite's
  `-wal` and `-shm` (the database's real path: a link to it shares its
  marks): several processes may hold one session, and the kernel drops a
  mark when its process ends, a crash included, so no mark outlives its
  holder. The UI thread and turn workers may call it: one lock guards it.
- `deleting(session_id)` is the context a delete runs in: it takes the mark
  exclusively, so it raises a one-line `ChattermError` when any other holder
  has the session open (this owner's own mark is dropped first: the caller
  refuses its own open session itself), and no chatterm can open the
  session between the check and the delete. The mark file is removed after
  the delete (tried). `check_not_open_elsewhere(session_id)` raises the same
  error without deleting, so a question ("Delete session N?") is not asked
  only to be refused after the answer.
- Marking is best effort: where `flock` is missing (Windows) or the folder
  cannot be written, nothing is marked and nothing is refused; a chat never
  fails for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Iterator

from chatterm.errors import ChattermError

HOLD_TRIES = 5
"""Tries, 10 ms apart, to mark a session another chatterm holds exclusively
for a moment (`check_not_open_elsewhere`)."""

try:
    import fcntl
except ImportError:  # Windows: no flock; sessions are not marked there
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


class SessionHolds:
    """The session one store's owner has open. See the module contract."""

    def __init__(self, store_path: Path):
        self.folder = Path(f"{os.path.realpath(store_path)}-open")
        self._lock = threading.Lock()
        self._held: tuple[int, int] | None = None
        """(session id, descriptor holding its shared lock)."""
        self._holder: object = None
        """Who asked for the mark last (`hold`)."""

    def _open(self, session_id: int) -> int | None:
        if fcntl is None:
            return None
        try:
            self.folder.mkdir(exist_ok=True)
            return os.open(self.folder / str(session_id), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            log.info("session %s not marked open: %s", session_id, exc)
            return None

    def hold(self, session_id: int | None, holder: object = None, *, only_if_holder: bool = False) -> None:
        with self._lock:
            if only_if_holder and holder is not self._holder:
                return
            self._holder = holder
            if self._held is not None and self._held[0] == session_id:
                return
            self._release()
            if session_id is None or (fd := self._open(session_id)) is None:
                return
            for attempt in range(HOLD_TRIES):
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    # Held exclusively: a delete (the session is going), or a
                    # check before a delete's question, which lets go at once.
                    if attempt == HOLD_TRIES - 1:
                        log.info("session %s not marked open: a delete holds it", session_id)
                        os.close(fd)
                        return
                    time.sleep(0.01)
                except OSError as exc:
                    log.info("session %s not marked open: %s", session_id, exc)
                    os.close(fd)
                    return
            self._held = (session_id, fd)

    def release(self) -> None:
        with self._lock:
            self._release()

    def _release(self) -> None:
        if self._held is not None:
            os.close(self._held[1])  # closing the descriptor drops its lock
            self._held = None

    def check_not_open_elsewhere(self, session_id: int) -> None:
        """`deleting`'s refusal, checked now (this owner's own mark aside)."""
        with self._lock:
            if fcntl is None or (self._held is not None and self._held[0] == session_id):
                return
        try:
            fd = os.open(self.folder / str(session_id), os.O_RDWR)
        except OSError:  # no mark file: no chatterm has it open
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _open_elsewhere(session_id) from None
        except OSError as exc:
            log.info("session %s: open marks not checked: %s", session_id, exc)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def deleting(self, session_id: int) -> Iterator[None]:
        with self._lock:
            if self._held is not None and self._held[0] == session_id:
                self._release()
        fd = self._open(session_id)
        if fd is None:
            yield
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _open_elsewhere(session_id) from None
            except OSError as exc:  # no locks on this file system (some network mounts)
                log.info("session %s: open marks not checked: %s", session_id, exc)
            try:
                yield
            finally:  # held exclusively: no one else has it open
                with contextlib.suppress(OSError):
                    os.unlink(self.folder / str(session_id))
        finally:
            os.close(fd)


def _open_elsewhere(session_id: int) -> ChattermError:
    return ChattermError(
        f"session {session_id} is open in another chatterm; open another session there "
        "(or quit it) before deleting this one"
    )
