"""``python -m memstrata`` runs the command line, like the ``memstrata`` script."""

import sys

from .cli import main

sys.exit(main())
