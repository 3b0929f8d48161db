"""``python -m stratamem`` runs the command line, like the ``stratamem`` script."""

import sys

from .cli import main

sys.exit(main())
