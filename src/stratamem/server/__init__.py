"""stratamem's REST server: GUMem's wire format over the engine, with projects and keys.

``create_app(memory=None, settings=None)`` builds the FastAPI application; ``stratamem
serve`` runs it with uvicorn. FastAPI is an optional dependency (``pip install
'stratamem[server]'``) and is imported only when an app is built, so ``import stratamem``
never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._settings import ServerSettings, load_server_settings

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["ServerSettings", "create_app", "load_server_settings"]


def create_app(memory: Any = None, settings: ServerSettings | None = None) -> FastAPI:
    """The REST API as a FastAPI app over ``memory`` (see ``docs/server.md``).

    Without ``memory`` it opens ``Memory()`` from the environment at startup and closes it
    at shutdown; a Memory passed in stays the caller's to close.
    """
    try:
        from ._app import create_app as build
    except ModuleNotFoundError as exc:
        if exc.name in ("fastapi", "starlette", "pydantic_core"):
            from ..errors import ConfigError

            raise ConfigError("the server needs FastAPI: pip install 'stratamem[server]'") from None
        raise
    return build(memory, settings)
