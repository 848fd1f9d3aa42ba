"""``python -m tosakit`` is the ``tosakit`` command."""

import sys

from .cli import main

sys.exit(main())
