"""`chatterm cache` (placeholder until implemented)."""

from chatterm.core.errors import ChattermError


def register(sub, common) -> None:
    p = sub.add_parser("cache", parents=[common], help="cache (not yet implemented)")
    p.set_defaults(func=run)


def run(args) -> int:
    raise ChattermError("'cache' is not implemented yet")
