"""`chatterm bench` (placeholder until implemented)."""

from chatterm.core.errors import ChattermError


def register(sub, common) -> None:
    p = sub.add_parser("bench", parents=[common], help="bench (not yet implemented)")
    p.set_defaults(func=run)


def run(args) -> int:
    raise ChattermError("'bench' is not implemented yet")
