"""What every dashboard page does before its own work: find the viewer, check the CSRF
token of a form, run the memory calls off the event loop, and turn stratamem's refusals
into a readable page with the right status."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..errors import ConflictError, NotFoundError, ValidationError
from ..memory import Memory
from ._render import href, render
from ._signin import Viewer, csrf_matches, current_viewer

__all__ = ["Form", "Page", "confirm", "endpoint", "error_page", "root_memory", "see_other"]

log = logging.getLogger("stratamem.ui")

Form = Mapping[str, str]
Page = Callable[[Request, Viewer, Form], Response]

# A form has a handful of fields; anything bigger is not one of ours.
_MAX_FIELDS = 50


def root_memory(request: Request) -> Memory:
    memory: Memory = request.app.state.memory()
    return memory


def see_other(request: Request, path: str, **params: Any) -> RedirectResponse:
    # 303: the browser follows a POST's answer with a GET (reloading does not repost).
    return RedirectResponse(href(request, path, **params), status_code=303)


def error_page(request: Request, viewer: Viewer | None, status: int, message: str) -> Response:
    return render(request, "error.html", status, viewer=viewer, status=status, message=message)


def confirm(
    request: Request,
    viewer: Viewer,
    form: Form,
    *,
    title: str,
    consequence: str,
    fields: tuple[str, ...],
    cancel: str,
    danger: bool = True,
) -> Response | None:
    """``None`` when the form was confirmed; otherwise the page that asks to confirm it.

    The confirmation repeats the form's own ``fields`` as hidden inputs and posts back to the
    same URL with ``confirm=yes``: no script, works with the keyboard and without one."""
    if form.get("confirm") == "yes":
        return None
    return render(
        request,
        "confirm.html",
        viewer=viewer,
        title=title,
        consequence=consequence,
        action=str(request.url.path),
        hidden=[(f, form[f]) for f in fields if f in form],
        cancel=cancel,
        danger=danger,
    )


def endpoint(
    page: Page, *, post: bool = False, needs_project: bool = True
) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint around ``page(request, viewer, form)``, which runs in a thread."""

    async def handle(request: Request) -> Response:
        root = root_memory(request)
        viewer = await run_in_threadpool(current_viewer, request, root)
        if viewer is None:
            if post:
                return error_page(request, None, 401, "Your session has ended; sign in again.")
            return see_other(request, "/login", next=_next(request))
        form: dict[str, str] = {}
        if post:
            try:
                data = await request.form(max_files=0, max_fields=_MAX_FIELDS)
            except Exception:  # multipart's own errors: a malformed or oversized form
                return error_page(request, viewer, 400, "The form could not be read.")
            form = {k: v for k, v in data.items() if isinstance(v, str)}
            if not csrf_matches(viewer.csrf, form):
                return error_page(
                    request,
                    viewer,
                    403,
                    "This form is missing its security token or it has expired. "
                    "Reload the page and try again.",
                )
        if needs_project and viewer.memory is None:
            return see_other(request, "/projects")
        try:
            return await run_in_threadpool(page, request, viewer, form)
        except NotFoundError as e:
            return error_page(request, viewer, 404, str(e))
        except ConflictError as e:
            return error_page(request, viewer, 409, str(e))
        except ValidationError as e:
            return error_page(request, viewer, 400, str(e))
        except Exception:
            # Logged with the request id; the page quotes the id, never the exception.
            request_id = request.scope.get("state", {}).get("request_id", "")
            log.exception("dashboard request %s failed", request_id)
            return error_page(
                request, viewer, 500, f"Something went wrong (request {request_id or '?'})."
            )

    return handle


def _next(request: Request) -> str:
    path = request.url.path
    return path + (f"?{request.url.query}" if request.url.query else "")
