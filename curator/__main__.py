"""`python -m curator` runs the CLI."""

from curator.cli import main

main()
