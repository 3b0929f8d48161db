"""Provider JSON read the way capture reads SDK objects.

Capture's endpoints (``capture/_openai.py``, ``_anthropic.py``) read a response or a stream
chunk by attribute (``result.choices[0].message.content``), as the SDKs return pydantic
objects. The proxy has the same answers as JSON: :func:`loads` parses them into objects
readable the same way, so the proxy uses capture's readers instead of a second copy.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Fields", "loads"]


class Fields(dict[str, Any]):
    """A JSON object whose keys are also attributes; an absent key reads as None, as an
    unset optional field of an SDK model does."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe dunders
            raise AttributeError(name)
        return self.get(name)


def loads(raw: bytes | str) -> Any:
    """``raw`` parsed, every object in it a :class:`Fields` (built once, while parsing)."""
    return json.loads(raw, object_hook=Fields)
