"""Provider JSON read the way capture reads SDK objects.

Capture's endpoints (``capture/_openai.py``, ``_anthropic.py``) read a response or a stream
chunk by attribute (``result.choices[0].message.content``), as the SDKs return pydantic
objects. The proxy has the same answers as parsed JSON: :func:`view` makes them readable
the same way, so the proxy uses capture's readers instead of a second copy of them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Fields", "view"]


class Fields(dict[str, Any]):
    """A JSON object whose keys are also attributes; an absent key reads as None, as an
    unset optional field of an SDK model does."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe dunders
            raise AttributeError(name)
        return view(self.get(name))


def view(value: Any) -> Any:
    """``value`` (parsed JSON) with every object in it a :class:`Fields`."""
    if isinstance(value, dict):
        return value if isinstance(value, Fields) else Fields(value)
    if isinstance(value, list):
        return [view(v) for v in value]
    return value
