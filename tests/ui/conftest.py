"""Fixtures for the Pilot tests: a workspace in tmp_path and an app on a FakeEngine."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine

from chatterm.core.workspace import Workspace
from chatterm.ui.launch import make_app


@pytest.fixture
def workspace(isolated_dirs, tmp_path) -> Workspace:
    return Workspace.load(db_path=tmp_path / "data" / "chatterm.db")


@pytest.fixture
def build(workspace):
    """build(replies=..., **make_app_kwargs) -> (app, engine)."""

    def _build(replies=(), *, engine_kwargs=None, load_gate=None, **kwargs):
        engines: list[FakeEngine] = []

        def factory(spec):
            engine = FakeEngine(spec, workspace.catalog.price(spec.price_profile), replies,
                                **(engine_kwargs or {}))
            engine.load_gate = load_gate
            engines.append(engine)
            return engine

        kwargs.setdefault("gpu_status", lambda: None)
        app = make_app(workspace, engine_factory=factory, **kwargs)
        return app, engines

    return _build
