"""`chatterm export` (placeholder until implemented)."""

from chatterm.core.errors import ChattermError


def register(sub, common) -> None:
    p = sub.add_parser("export", parents=[common], help="export (not yet implemented)")
    p.set_defaults(func=run)


def run(args) -> int:
    raise ChattermError("'export' is not implemented yet")
