"""`python -m memwarden` runs the command line."""

from memwarden.cli import main

raise SystemExit(main())
