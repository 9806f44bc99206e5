"""How a thread worker's failure reaches the screen: as a message with one line.

Contract: a worker body runs inside `reported(target, failed, what)` and posts
its own message when it succeeds. An exception ends the body and is posted to
`target` as `failed(line)`, the line worded by `chatterm.errors.describe` (a
ChattermError's own line; anything else names its type and is logged with its
traceback under `what`), so the user gets a notice, never a traceback.
`EngineClosing` ends the body silently: the app is quitting and nobody would
see a report.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator

from textual.message import Message
from textual.message_pump import MessagePump

from chatterm.errors import ChattermError, describe
from chatterm.ui.engine_lease import EngineClosing

log = logging.getLogger(__name__)


@contextlib.contextmanager
def reported(target: MessagePump, failed: Callable[[str], Message], what: str) -> Iterator[None]:
    try:
        yield
    except EngineClosing:
        return
    except Exception as exc:  # noqa: BLE001 - shown to the user, never a traceback
        if not isinstance(exc, ChattermError):
            log.exception("%s failed", what)
        target.post_message(failed(describe(exc)))
