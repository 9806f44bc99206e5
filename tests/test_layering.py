"""The core is headless: chatterm.core never imports textual or rich.

Importing every core module must not load textual. rich is checked in the
source (AST), because httpx itself imports rich when it happens to be installed.
"""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import chatterm.core

UI_LIBRARIES = {"textual", "rich"}


def test_core_modules_import_no_ui_library_in_source():
    offenders = []
    for path in Path(chatterm.core.__path__[0]).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in UI_LIBRARIES]
    assert offenders == []


def test_importing_the_core_loads_no_textual():
    modules = [m.name for m in pkgutil.iter_modules(chatterm.core.__path__, "chatterm.core.")]
    assert "chatterm.core.local_engine" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'textual')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
