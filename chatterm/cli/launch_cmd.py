"""`chatterm launch` (placeholder until implemented)."""

from chatterm.core.errors import ChattermError


def register(sub, common) -> None:
    p = sub.add_parser("launch", parents=[common], help="launch (not yet implemented)")
    p.set_defaults(func=run)


def run(args) -> int:
    raise ChattermError("'launch' is not implemented yet")
