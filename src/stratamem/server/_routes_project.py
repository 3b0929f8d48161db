"""Who the caller is: the project an API key opens, so a client need not be told twice."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel

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
