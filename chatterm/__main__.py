"""`python -m chatterm` is the same as the `chatterm` console script."""

from chatterm.cli import main

raise SystemExit(main())
