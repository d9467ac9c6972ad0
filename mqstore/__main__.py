"""`python -m mqstore` is the `mqstore` command."""

from mqstore.workers.cli import main

raise SystemExit(main())
