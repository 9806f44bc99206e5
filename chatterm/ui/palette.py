"""The app's entries in Textual's command palette (Ctrl+P).

`chat_commands(app)` yields one `SystemCommand` per persona and one per app
action that has a key; the app adds them after Textual's own (themes, quit,
screenshot). Names from files are escaped: the palette parses markup.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Iterable

from textual.app import SystemCommand

from chatterm.core.metrics.format import printable

if TYPE_CHECKING:
    from chatterm.ui.app import ChatApp


def chat_commands(app: "ChatApp") -> Iterable[SystemCommand]:
    for persona in app.workspace.personas:
        yield SystemCommand(
            palette_text(f"Persona: {persona.name}"),
            palette_text(f"Switch to {persona.id} (starts a new conversation)"),
            partial(app.switch_persona, persona.id),
        )
    yield SystemCommand("Persona picker", "List personas and their cache state (F2)", app.action_personas)
    yield SystemCommand("Sessions", "Open a past session to continue it (F3)", app.action_sessions)
    yield SystemCommand("New conversation", "Start over with the same persona (Ctrl+N)",
                        app.action_new_conversation)
    yield SystemCommand("Latency", "Charts of TTFT, decode rate and cost per turn; what-if pricing (F5)",
                        app.action_latency)
    for fmt, label in (("md", "Markdown report"), ("html", "HTML report with charts"), ("jsonl", "JSONL"),
                       ("csv", "CSV")):
        yield SystemCommand(f"Export session: {label}", f"Write this session as {fmt} to the data folder",
                            partial(app.action_export, fmt))
    yield SystemCommand("Toggle dashboard", "Show or hide the latency dashboard (F4)", app.action_toggle_dashboard)
    yield SystemCommand("Help", "Every key (F1)", app.action_help)


def palette_text(text: str) -> str:
    """Text for the command palette, which parses markup: every `[` escaped
    (textual.markup.escape leaves a trailing `[/` as is, textual#6155)."""
    return printable(text).replace("[", "\\[")
