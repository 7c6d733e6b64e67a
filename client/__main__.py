"""`python -m client chat "prompt"`."""

from client.cli import main

raise SystemExit(main())
