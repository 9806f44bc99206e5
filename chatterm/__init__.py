"""chatterm: a terminal chat client for local GGUF models that makes latency visible."""

__version__ = "0.1.0"
