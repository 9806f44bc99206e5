"""The headless core of chatterm.

Nothing under `chatterm.core` imports textual or rich: the CLI and the TUI both
stand on it, and tests drive it without a terminal (tests/test_layering.py checks).
"""
