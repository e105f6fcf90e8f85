"""The package's version, for the runs table and `--version`: a module of its own so
that any layer can read it without importing the package's front door."""

__version__ = "0.2.0"
