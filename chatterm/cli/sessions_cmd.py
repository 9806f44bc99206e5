"""`chatterm sessions` (placeholder until implemented)."""

from chatterm.core.errors import ChattermError


def register(sub, common) -> None:
    p = sub.add_parser("sessions", parents=[common], help="sessions (not yet implemented)")
    p.set_defaults(func=run)


def run(args) -> int:
    raise ChattermError("'sessions' is not implemented yet")
