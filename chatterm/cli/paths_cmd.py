"""`chatterm paths` (placeholder until implemented)."""

from chatterm.core.errors import ChattermError


def register(sub, common) -> None:
    p = sub.add_parser("paths", parents=[common], help="paths (not yet implemented)")
    p.set_defaults(func=run)


def run(args) -> int:
    raise ChattermError("'paths' is not implemented yet")
