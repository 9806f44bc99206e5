"""`make_app`: the one factory that builds the chat app, shared by CLI, tests and benchmarks.

Contract: it resolves model, persona, theme and the session to resume (bad ids
raise `ChattermError` naming them, before anything is drawn: the CLI prints one
line and exits 2) and returns a `ChatApp`. Nothing is loaded here: the model
loads in the app's worker once its first frame is on screen, and a load that
fails is reported in the app. `chatterm launch` checks the model file itself
(`ModelSpec.check_file`) before the session database is opened, so a missing
file is its one line and exit 2, not a screen.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual.theme import BUILTIN_THEMES

from chatterm.core.config import paths
from chatterm.core.config.schema import skipped
from chatterm.errors import ChattermError
from chatterm.ui.app import ChatApp
from chatterm.ui.engine_setup import EngineFactory, GpuProbe, MeterFactory, default_gpu_status
from chatterm.ui.resume import read_resume
from chatterm.ui.settings import load_ui_settings
from chatterm.ui.themes import DEFAULT_THEME, ThemeSet, load_themes

if TYPE_CHECKING:
    from chatterm.core.store.session_store import SessionStore
    from chatterm.core.workspace import Workspace


def require_theme(theme: str | None, themes: ThemeSet | None = None) -> None:
    """A ChattermError when `theme` is not one to use: its file's error when
    that file was skipped, else the valid themes."""
    if theme is None:
        return
    themes = load_themes() if themes is None else themes
    known = set(BUILTIN_THEMES) | set(themes.themes)
    if theme in known:
        return
    if theme in themes.broken:
        raise ChattermError(themes.broken[theme])
    raise ChattermError(f"unknown theme {theme!r}; valid themes: {', '.join(sorted(known))}")


def make_app(
    workspace: "Workspace",
    *,
    model_id: str | None = None,
    persona_id: str | None = None,
    theme: str | None = None,
    resume: int | str | None = None,
    store: "SessionStore | None" = None,
    engine_factory: EngineFactory | None = None,
    theme_folders: list[Path] | None = None,
    settings_path: Path | None = None,
    type_ahead: bool = True,
    gpu_status: GpuProbe = default_gpu_status,
    energy_meter: MeterFactory | None = None,
) -> ChatApp:
    """Build the app. `resume` is a session id or "latest" (needs `store`)."""
    notices = [skipped(error) for error in (*workspace.catalog.errors, *workspace.personas.errors)]
    resume_data = None
    if resume is not None:
        if store is None:
            raise ChattermError("--resume needs the session database")
        resume_data = read_resume(store, workspace, resume, model_id, persona_id)
        spec, persona = resume_data.plan.spec, resume_data.plan.persona
        notices += resume_data.plan.warnings
    else:
        spec, persona = workspace.resolve(model_id, persona_id)

    settings_path = paths.settings_file() if settings_path is None else settings_path
    settings = load_ui_settings(settings_path)
    if settings.error:
        notices.append(settings.error)
    themes = load_themes(theme_folders)
    notices += themes.errors
    require_theme(theme, themes)
    known = set(BUILTIN_THEMES) | set(themes.themes)
    chosen = theme or settings.theme or DEFAULT_THEME
    if chosen not in known:
        notices.append(f"remembered theme {chosen!r} is not available; using {DEFAULT_THEME}")
        chosen = DEFAULT_THEME if DEFAULT_THEME in known else "textual-dark"
    return ChatApp(
        workspace,
        spec,
        persona,
        engine_factory=engine_factory or workspace.make_engine,
        store=store,
        themes=themes,
        theme=chosen,
        settings_path=settings_path,
        type_ahead=type_ahead and settings.type_ahead,
        resume=resume_data,
        gpu_status=gpu_status,
        energy_meter=energy_meter,
        startup_notices=notices,
    )
