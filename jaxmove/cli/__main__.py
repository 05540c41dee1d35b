"""``python -m jaxmove.cli ...`` is the ``jaxmove`` command."""

import sys

from . import main

sys.exit(main())
