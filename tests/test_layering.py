"""The core is headless: importing every chatterm.core module loads no textual or rich."""

import pkgutil
import subprocess
import sys

import chatterm.core


def test_core_imports_no_ui_library():
    modules = [m.name for m in pkgutil.iter_modules(chatterm.core.__path__, "chatterm.core.")]
    assert "chatterm.core.local_engine" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"chatterm.core imported UI modules: {out.stdout}"
