"""Print the REST API's OpenAPI document, the one `stratamem serve` serves at /openapi.json.

Built from the FastAPI app as the server builds it, without starting a server or opening a
store: ``python scripts/openapi.py > openapi.json``. The developer's ``STRATAMEM_*``
variables are ignored so the document is the same on every machine. ``npm run generate``
runs this (with ``$PYTHON``, default ``python3``) and turns the document into
``src/openapi.ts``.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    for name in [k for k in os.environ if k.startswith("STRATAMEM_")]:
        del os.environ[name]
    from stratamem.server import create_app

    json.dump(create_app().openapi(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
