"""`python -m floodgate_client chat "prompt"` (installed: `floodgate-client chat "prompt"`)."""

from floodgate_client.cli import main

raise SystemExit(main())
