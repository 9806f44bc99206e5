"""`chatterm ask` (placeholder until implemented)."""

from chatterm.core.errors import ChattermError


def register(sub, common) -> None:
    p = sub.add_parser("ask", parents=[common], help="ask (not yet implemented)")
    p.set_defaults(func=run)


def run(args) -> int:
    raise ChattermError("'ask' is not implemented yet")
