"""``python -m tosakit`` is the ``tosakit`` command; ``run`` is also the console script's entry point."""

import os
import sys


def run() -> None:
    """Import the command and run it: Ctrl-C while it is still importing ends as it does later, with one line
    and exit code 130 (``entry`` installs the handler for the rest)."""
    try:
        from .cli import entry
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        os._exit(130)
    entry()


if __name__ == "__main__":
    run()
