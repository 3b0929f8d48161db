"""Who the caller is (the project an API key opens, so a client need not be told twice),
and what the project's memory costs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from .._usage import MAX_DAYS
from ..types import Usage
from ._auth import CallerDep
from ._common import API_ERRORS
from ._models import Envelope

router = APIRouter(prefix="/api", tags=["project"], responses=API_ERRORS)


class KeyInfo(BaseModel):
    id: str
    prefix: str
    name: str | None = None
    created_at: datetime


class ProjectInfo(BaseModel):
    """The caller's project and the key it authenticated with (never the key itself)."""

    project_id: str
    name: str | None = None
    key: KeyInfo


@router.get(
    "/project",
    summary="The caller's project",
    description="The project the API key belongs to, and which key it is (id and prefix).",
    response_model=Envelope[ProjectInfo],
)
def whoami(caller: CallerDep) -> Envelope[ProjectInfo]:
    key = caller.key
    # Projects made implicitly (an embedded Memory's project_id) have no record: no name.
    project = caller.memory.store.get_project(key.project_id)
    return Envelope(
        data=ProjectInfo(
            project_id=key.project_id,
            name=None if project is None else project.name,
            key=KeyInfo(id=key.id, prefix=key.prefix, name=key.name, created_at=key.created_at),
        )
    )


@router.get(
    "/usage",
    summary="What memory costs",
    description="The write pipeline's model calls of the caller's project over the last "
    "`days` UTC days (today included): tokens per day and per model, messages processed "
    "per day and tokens per processed message, and their cost where the server's "
    "`llm_prices` setting prices the model (`null` otherwise; `unpriced` names those).",
    response_model=Envelope[Usage],
)
def usage(
    caller: CallerDep,
    days: Annotated[int, Query(ge=1, le=MAX_DAYS, description="How many days, up to today.")] = 30,
) -> Envelope[Usage]:
    return Envelope(data=caller.memory.usage(days=days))
