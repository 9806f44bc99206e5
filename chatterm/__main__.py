"""`python -m chatterm` is the same as the `chatterm` console script."""

from chatterm.entry import main

raise SystemExit(main())
