"""Who may use the engine, and when it is closed.

The app's worker threads (model load, persona prepare, turns) share one engine.
Closing a llama.cpp context while another thread decodes with it crashes the
process, and app exit must not wait for a turn nobody will see. So the engine is
closed exactly once, by whoever is last: the app when it quits while no worker
holds the engine, or the last worker to let go of it after the app has quit.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator

from chatterm.core.engine.interface import Engine

log = logging.getLogger(__name__)


class EngineClosing(Exception):
    """The app is quitting: the engine must not be used any more."""


class EngineLease:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False
        self._engine: Engine | None = None

    @property
    def engine(self) -> Engine | None:
        return self._engine

    @property
    def closing(self) -> bool:
        """The app is quitting (a model load in progress should give up)."""
        return self._closing

    def adopt(self, engine: Engine) -> bool:
        """Take a freshly loaded engine; False (and it is closed) when the app is quitting."""
        with self._lock:
            if not self._closing:
                self._engine = engine
                return True
        _close(engine)
        return False

    @contextlib.contextmanager
    def use(self) -> Iterator[Engine]:
        with self._lock:
            if self._closing or self._engine is None:
                raise EngineClosing()
            self._users += 1
            engine = self._engine
        try:
            yield engine
        finally:
            with self._lock:
                self._users -= 1
                last = self._closing and self._users == 0
            if last:
                self._close_now()

    def close_when_idle(self) -> None:
        """Mark the app as quitting; close now if no worker uses the engine."""
        with self._lock:
            self._closing = True
            idle = self._users == 0
            engine = self._engine
        if idle:
            self._close_now()
        elif engine is not None:
            engine.interrupt()  # a long prefill stops now instead of holding the exit

    def _close_now(self) -> None:
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            _close(engine)


def _close(engine: Engine) -> None:
    try:
        engine.close()
    except Exception:  # noqa: BLE001 - quitting must not fail on a close error
        log.exception("closing the engine failed")
