"""Which sessions a running chatterm has open, so that another one (the TUI in
a second terminal, `chatterm sessions delete`) does not delete one under it.

Contract:
- `SessionHolds(store_path)` marks at most one session as open by its owner:
  `hold(session_id)` marks it (and unmarks the one held before; None marks
  none), `release()` unmarks. A mark is a shared `flock` on the empty file
  `<store>-open/<id>` (beside SQLite's `-wal` and `-shm`): several
  processes may hold one session, and the kernel drops a mark when its
  process ends, a crash included, so no mark outlives its holder.
- `deleting(session_id)` is the context a delete runs in: it takes the mark
  exclusively, so it raises a one-line `ChattermError` when any other holder
  has the session open (this owner's own mark is dropped first: the caller
  refuses its own open session itself), and no chatterm can open the
  session between the check and the delete. The mark file is removed after
  the delete (tried).
- Marking is best effort: where `flock` is missing (Windows) or the folder
  cannot be written, nothing is marked and nothing is refused; a chat never
  fails for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterator

from chatterm.errors import ChattermError

try:
    import fcntl
except ImportError:  # Windows: no flock; sessions are not marked there
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


class SessionHolds:
    """The session one store's owner has open. See the module contract."""

    def __init__(self, store_path: Path):
        self.folder = Path(f"{store_path}-open")
        self._held: tuple[int, int] | None = None
        """(session id, descriptor holding its shared lock)."""

    def _open(self, session_id: int) -> int | None:
        if fcntl is None:
            return None
        try:
            self.folder.mkdir(exist_ok=True)
            return os.open(self.folder / str(session_id), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            log.info("session %s not marked open: %s", session_id, exc)
            return None

    def hold(self, session_id: int | None) -> None:
        if self._held is not None and self._held[0] == session_id:
            return
        self.release()
        if session_id is None or (fd := self._open(session_id)) is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:  # a delete holds it right now: the session is going
            log.info("session %s not marked open: %s", session_id, exc)
            os.close(fd)
            return
        self._held = (session_id, fd)

    def release(self) -> None:
        if self._held is not None:
            os.close(self._held[1])  # closing the descriptor drops its lock
            self._held = None

    @contextlib.contextmanager
    def deleting(self, session_id: int) -> Iterator[None]:
        if self._held is not None and self._held[0] == session_id:
            self.release()
        fd = self._open(session_id)
        if fd is None:
            yield
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ChattermError(
                    f"session {session_id} is open in another chatterm; open another session there "
                    "(or quit it) before deleting this one"
                ) from None
            except OSError as exc:  # no locks on this file system (some network mounts)
                log.info("session %s: open marks not checked: %s", session_id, exc)
            try:
                yield
            finally:  # held exclusively: no one else has it open
                with contextlib.suppress(OSError):
                    os.unlink(self.folder / str(session_id))
        finally:
            os.close(fd)
