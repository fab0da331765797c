"""`python -m compiler` runs the `tessel` command."""

from compiler.cli import main

raise SystemExit(main())
