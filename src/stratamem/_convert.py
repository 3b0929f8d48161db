"""Stored rows to public models, field by field by name.

A row (a dataclass of ``store/_rows.py``) and the public model it becomes (``types.py``)
name their fields alike; times are ISO strings in the row and datetimes in the model. One
plan per (model, row type) says where each of the model's fields comes from and how its
time is read, and fails at once if a field has no source, so a field added to a model but
not to its row is an error on first use, not a silent default.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from ._time import parse_iso, parse_stored

__all__ = ["from_row"]

M = TypeVar("M", bound=BaseModel)

# (model field, row attribute, how its value is read or None), per model, row type,
# renames and given fields
_Plan = tuple[tuple[str, str, Callable[[Any], Any] | None], ...]
_plans: dict[tuple[type[BaseModel], type, tuple[tuple[str, str], ...], tuple[str, ...]], _Plan] = {}


def _is_time(annotation: Any) -> bool:
    if annotation is datetime:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return datetime in typing.get_args(annotation)
    return False


def _plan(
    model: type[BaseModel], row_type: type, rename: tuple[tuple[str, str], ...], given: set[str]
) -> _Plan:
    sources = dict(rename)
    plan = []
    for name, info in model.model_fields.items():
        if name in given:
            continue
        attribute = sources.get(name, name)
        if not hasattr(row_type, attribute) and attribute not in getattr(
            row_type, "__dataclass_fields__", {}
        ):
            raise TypeError(f"{row_type.__name__} has no {attribute!r} for {model.__name__}.{name}")
        read = None
        if _is_time(info.annotation):
            read = parse_stored if info.is_required() else parse_iso
        plan.append((name, attribute, read))
    return tuple(plan)


def from_row(
    model: type[M], row: object, *, rename: Mapping[str, str] | None = None, **given: Any
) -> M:
    """``model`` of ``row``: each field from the row's attribute of the same name (or the
    one ``rename`` names), times parsed; ``given`` values are taken as they are."""
    # Insertion order, not sorted: a call site always passes the same names in the same
    # order, and a plan per order is only a second entry of the cache.
    renames = tuple(rename.items()) if rename else ()
    key = (model, type(row), renames, tuple(given))
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _plan(model, type(row), renames, set(given))
    values = {
        name: getattr(row, attribute) if read is None else read(getattr(row, attribute))
        for name, attribute, read in plan
    }
    return model(**values, **given)
