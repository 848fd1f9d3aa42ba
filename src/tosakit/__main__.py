"""``python -m tosakit`` is the ``tosakit`` command."""

from .cli import entry

entry()
