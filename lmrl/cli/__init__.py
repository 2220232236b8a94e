"""The `lmrl` command line; `python -m lmrl` and the `lmrl` script run `main`."""

from .commands import main

__all__ = ["main"]
