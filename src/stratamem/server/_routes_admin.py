"""The admin API: projects and their API keys, guarded by the admin token.

Keys are random, stored hashed and shown once (in the response that creates them).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ..types import ApiKey, Project
from ._auth import Admin
from ._common import API_ERRORS
from ._models import CreateKey, CreateProject, Envelope, NewApiKey

_ADMIN_ERRORS = {
    **API_ERRORS,
    401: {**API_ERRORS[401], "description": "Missing or wrong admin token."},
    403: {**API_ERRORS[401], "description": "The admin API is disabled (no admin token set)."},
}

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Admin], responses=_ADMIN_ERRORS)


def _mem(request: Request) -> Any:
    return request.app.state.memory


@router.post(
    "/projects",
    summary="Create a project",
    description="A tenant: its own sessions, memory and API keys. `project_id` chooses "
    "the id; an existing project of that id is returned as it is.",
    response_model=Envelope[Project],
    status_code=201,
)
def create_project(body: CreateProject, request: Request) -> Envelope[Project]:
    project = _mem(request).projects.create(body.name, project_id=body.project_id)
    return Envelope(data=project)


@router.get(
    "/projects",
    summary="List projects",
    response_model=Envelope[list[Project]],
)
def list_projects(request: Request) -> Envelope[list[Project]]:
    return Envelope(data=_mem(request).projects.list())


@router.post(
    "/projects/{project_id:path}/keys",
    summary="Create an API key",
    description="The response carries the key (`data.secret`); it is stored hashed and "
    "cannot be shown again.",
    response_model=Envelope[NewApiKey],
    status_code=201,
)
def create_key(project_id: str, body: CreateKey, request: Request) -> Envelope[NewApiKey]:
    key, secret = _mem(request).keys.create(project_id, name=body.name)
    return Envelope(data=NewApiKey(key=key, secret=secret))


@router.get(
    "/projects/{project_id:path}/keys",
    summary="List a project's API keys",
    description="Never the keys themselves: id, name, prefix, created, revoked, last used.",
    response_model=Envelope[list[ApiKey]],
)
def list_keys(project_id: str, request: Request) -> Envelope[list[ApiKey]]:
    memory = _mem(request)
    memory.projects.get(project_id)  # an unknown project is a 404, not an empty list
    return Envelope(data=memory.keys.list(project_id))


# A project id may hold "/" (ID_PATTERN), hence ``:path``; the routes with a suffix come
# first, so "/projects/a/b/keys" is the keys of "a/b", not the project "a/b/keys".
@router.get(
    "/projects/{project_id:path}",
    summary="Get a project",
    response_model=Envelope[Project],
)
def get_project(project_id: str, request: Request) -> Envelope[Project]:
    return Envelope(data=_mem(request).projects.get(project_id))


@router.delete(
    "/keys/{key_id}",
    summary="Revoke an API key",
    description="Requests with a revoked key are refused (401) from then on.",
    response_model=Envelope[ApiKey],
)
def revoke_key(key_id: str, request: Request) -> Envelope[ApiKey]:
    return Envelope(data=_mem(request).keys.revoke(key_id))
