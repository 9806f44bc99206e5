"""The app's entries in Textual's command palette (Ctrl+P).

`chat_commands(app, personas, switch_persona, return_to)` yields one
`SystemCommand` per persona (calling `switch_persona` with its id; its help
says whether that goes back to the persona's last session, `return_to`) and
one per app action that has a key (run as `app.run_action`, as its key binding
would); the app adds them after Textual's own (themes, quit, screenshot;
not `TEXTUAL_HIDDEN`), and over a dialog has them close the dialogs before
they run. It
knows the app only as a Textual `App` and its actions by name. Names from
files are escaped: the palette parses markup.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Iterable

from textual.app import App, SystemCommand

from chatterm.core.config.personas import Persona
from chatterm.core.metrics.format import printable

ACTIONS: tuple[tuple[str, str, str], ...] = (
    ("Persona picker", "List personas and their cache state (F2)", "personas"),
    ("Sessions", "Open a past session to continue it (F3)", "sessions"),
    ("New conversation", "Start over with the same persona (Ctrl+N)", "new_conversation"),
    ("Regenerate reply", "Ask for the selected (else the last) reply again, as a branch (Ctrl+R, r)", "regenerate"),
    ("Edit message", "Edit the selected (else your last) message and resend it as a branch (e, ↑)", "edit_message"),
    ("Previous branch", "Show the selected reply's previous alternative (←)", "branch(-1)"),
    ("Next branch", "Show the selected reply's next alternative (→)", "branch(1)"),
    ("Fork session here", "A new session with the history up to the selected turn (f)", "fork"),
    ("Copy reply", "Copy the selected (else the last) reply to the clipboard (F9)", "copy_reply"),
    ("Copy code block", "Copy one of the reply's code blocks to the clipboard (F10)", "copy_code"),
    ("Latency", "Charts of TTFT, decode rate and cost per turn; what-if pricing (F5)", "latency"),
    ("Models", "The GGUF models on this machine (Ollama, LM Studio, HF cache, folders); switch to one", "models"),
    *(
        (f"Export session: {label}", f"Write this session as {kind} to the data folder (.{fmt})", f"export('{fmt}')")
        for fmt, label, kind in (("md", "Markdown report", "a Markdown report"),
                                 ("html", "HTML report with charts", "an HTML report"),
                                 ("jsonl", "JSONL", "JSON lines"), ("csv", "CSV", "CSV"))
    ),
    ("Toggle dashboard", "Show or hide the latency dashboard (F4)", "toggle_dashboard"),
    ("Help", "Every key (F1)", "help"),
)
"""(title, help, action) of each app action in the palette."""

TEXTUAL_RETOLD = {
    "Quit": "Quit chatterm; a reply being written is stored as stopped (Ctrl+Q)",
    "Screenshot": "Save an SVG picture of the screen to the data folder's exports",
}
"""Textual's own entries kept, described as the app's are (their key, where a file goes)."""

TEXTUAL_HIDDEN = frozenset({"Keys", "Maximize", "Minimize"})
"""Textual's own entries the app leaves out: Help (F1) lists every key, and
Textual's key panel squeezes the conversation; maximizing the focused widget
(most often the prompt) hides the chat with no way back a user would guess."""


def chat_commands(
    app: App, personas: Iterable[Persona], switch_persona: Callable[[str], None],
    return_to: Callable[[str], int | None] = lambda persona_id: None,
) -> Iterable[SystemCommand]:
    for persona in personas:
        session = return_to(persona.id)
        outcome = "a new conversation" if session is None else f"back to session {session}"
        yield SystemCommand(
            palette_text(f"Persona: {persona.name}"),
            palette_text(f"Switch to {persona.id} ({outcome})"),
            partial(switch_persona, persona.id),
        )
    for title, help_text, action in ACTIONS:
        yield SystemCommand(title, help_text, partial(app.run_action, action))


def palette_text(text: str) -> str:
    """Text for the command palette, which parses markup: every `[` escaped
    (textual.markup.escape leaves a trailing `[/` as is, textual#6155)."""
    return printable(text).replace("[", "\\[")
