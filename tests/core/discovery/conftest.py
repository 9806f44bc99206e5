from tests.core.discovery.layouts import gemma_file, layout  # noqa: F401 - session fixtures shared by these tests
