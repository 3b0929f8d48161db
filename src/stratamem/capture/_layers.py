"""Layers of capture: a framework object (a LangChain chat model, a PydanticAI agent, ...)
sits on top of a provider SDK client, and both may be registered. The outermost registered
layer captures the exchange; every layer under it stands down, so one exchange is stored
once and memory is injected once.

The outer layer marks the calls it makes with a context variable (:func:`outer`);
:meth:`Capture.before` returns None inside it, which makes an inner wrapper pass the call
through untouched. Context variables follow threads started by the frameworks' executors
(they copy the context) and asyncio tasks.

Framework objects are bound per instance (:func:`bind`) but patched per class: their
methods are wrapped on the class while at least one instance is registered, and a wrapper
only acts for a registered instance. Instance attributes would not do: LangChain models are
pydantic models whose copies (``model_copy``) would carry a wrapper bound to the original
instance, calling it with the original's settings.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._capture import Capture

__all__ = ["Wrapper", "bind", "bound", "inside", "outer"]

log = logging.getLogger("stratamem.capture")

_outer: ContextVar[tuple[Capture, ...]] = ContextVar("stratamem_outer_capture", default=())


def inside(capture: Capture) -> bool:
    """Whether the running code is inside a call that an outer layer of ``capture`` captures."""
    return any(c is capture for c in _outer.get())


@contextlib.contextmanager
def outer(capture: Capture) -> Iterator[None]:
    """Mark the calls made inside the block as captured by an outer layer of ``capture``."""
    token = _outer.set((*_outer.get(), capture))
    try:
        yield
    finally:
        try:
            _outer.reset(token)
        except ValueError:  # left in another context (a generator finalised elsewhere)
            _outer.set(tuple(c for c in _outer.get() if c is not capture))


# -- per-instance binding, per-class patching ------------------------------------------------

#: make(original) -> the function to put on the class. The function receives ``self`` and
#: must call ``original`` unchanged when :func:`bound` gives None for it.
Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]

_ORIGINAL = "__stratamem_original__"
_lock = threading.RLock()
# id(obj) -> the Capture it is registered with (the Capture holds obj, so the id is live)
_bound: dict[int, Capture] = {}


@dataclass
class _Patch:
    original: Any  # the class's own attribute, or _ABSENT when it was inherited
    users: int


_ABSENT = object()
_patches: dict[tuple[type, str], _Patch] = {}


def bound(obj: Any) -> Capture | None:
    """The Capture that ``obj`` is registered with, if any."""
    return _bound.get(id(obj))


def _resolve(cls: type, name: str) -> Callable[..., Any]:
    for klass in cls.__mro__:
        if name in vars(klass):
            attr = vars(klass)[name]
            found: Callable[..., Any] = getattr(attr, _ORIGINAL, attr)  # never wrap our own
            return found
    raise AttributeError(f"{cls.__qualname__} has no method {name}")


def bind(obj: Any, capture: Capture, wrappers: dict[str, Wrapper]) -> Callable[[], None]:
    """Register ``obj`` with ``capture`` and wrap ``wrappers``' methods on its class.
    Returns the undo callback."""
    cls = type(obj)
    with _lock:
        _bound[id(obj)] = capture
        for name, make in wrappers.items():
            key = (cls, name)
            patch = _patches.get(key)
            if patch is None:
                original = _resolve(cls, name)
                if not inspect.isfunction(original):
                    raise TypeError(f"{cls.__qualname__}.{name} is not a plain method")
                wrapper = make(original)
                setattr(wrapper, _ORIGINAL, original)
                patch = _Patch(vars(cls).get(name, _ABSENT), 0)
                _patches[key] = patch
                setattr(cls, name, wrapper)
            patch.users += 1

    names = tuple(wrappers)

    def undo() -> None:
        with _lock:
            _bound.pop(id(obj), None)
            for name in names:
                key = (cls, name)
                patch = _patches.get(key)
                if patch is None:
                    continue
                patch.users -= 1
                if patch.users == 0:
                    del _patches[key]
                    if patch.original is _ABSENT:
                        delattr(cls, name)
                    else:
                        setattr(cls, name, patch.original)

    return undo
