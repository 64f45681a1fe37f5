"""The package's version, in one place (pyproject.toml's [project] version matches it)."""

__version__ = "0.1.0"
