"""The `spreeze` command line, on top of services/ and bench/ (see cli/main.py)."""
