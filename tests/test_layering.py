"""The package's layering rules, checked on every module under chatterm/.

- The core is headless: no module under chatterm.core imports textual or rich,
  in its source (AST, since httpx itself imports rich when it is installed) or
  when every core module is imported.
- No module imports another module's `_private` name: what a module offers is
  its public names.
Each check first asserts that it found modules, so a layout change cannot make
it check nothing.
"""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import chatterm
import chatterm.core

UI_LIBRARIES = {"textual", "rich"}
CORE_DIR = Path(chatterm.core.__path__[0])
PACKAGE_DIR = Path(chatterm.__path__[0])


def _imports(path: Path):
    """(module, names) for every import statement in the file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [a.name for a in node.names]


def test_core_modules_import_no_ui_library_in_source():
    sources = sorted(CORE_DIR.rglob("*.py"))
    assert len(sources) > 30, f"found only {len(sources)} core modules under {CORE_DIR}"
    assert any(p.parent != CORE_DIR for p in sources), "no core subpackage found"
    offenders = [
        f"{path.relative_to(CORE_DIR)}: {module}"
        for path in sources
        for module, _ in _imports(path)
        if module.split(".")[0] in UI_LIBRARIES
    ]
    assert offenders == []


def test_core_top_level_is_only_subpackages_and_the_composition_root():
    top = sorted(p.name for p in CORE_DIR.glob("*.py"))
    assert top == ["__init__.py", "workspace.py"]


def test_no_module_imports_another_modules_private_name():
    sources = sorted(PACKAGE_DIR.rglob("*.py"))
    assert len(sources) > 50
    offenders = [
        f"{path.relative_to(PACKAGE_DIR)}: from {module} import {name}"
        for path in sources
        for module, names in _imports(path)
        if module.startswith("chatterm")
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert offenders == []


def test_importing_the_core_loads_no_textual():
    modules = [m.name for m in pkgutil.walk_packages(chatterm.core.__path__, "chatterm.core.")]
    assert "chatterm.core.engine.local.engine" in modules
    assert len(modules) > 30
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'textual')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
