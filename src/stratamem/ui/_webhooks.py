"""Webhooks: the list, creating one, switching it on and off, rotating its secret (shown
once), deleting it, and its delivery log."""

from __future__ import annotations

from typing import get_args
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._vocabulary import WebhookEvent, WebhookMode, WebhookResource
from ..errors import ValidationError
from ._render import render
from ._signin import Viewer
from ._users import PAGE, page_of
from ._view import Form, confirm, endpoint, see_other

__all__ = ["routes"]

_CHOICES = {
    "resources": get_args(WebhookResource),
    "events": get_args(WebhookEvent),
    "modes": get_args(WebhookMode),
}


def _hook_path(hook_id: str) -> str:
    return f"/webhooks/{quote(hook_id, safe='')}"


def _list(request: Request, viewer: Viewer, form: Form, error: str | None = None) -> Response:
    memory = viewer.project
    return render(
        request,
        "webhooks.html",
        400 if error else 200,
        viewer=viewer,
        hooks=memory.webhooks.list(limit=1000),
        error=error,
        form=form,
        **_CHOICES,
    )


def _index(request: Request, viewer: Viewer, form: Form) -> Response:
    return _list(request, viewer, form)


def _create(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    timeout = form.get("timeout_ms", "").strip()
    try:
        if timeout and not timeout.isdigit():
            raise ValidationError("timeout_ms: expected a whole number of milliseconds")
        hook, secret = memory.webhooks.create(
            resource=form.get("resource", ""),
            event=form.get("event", ""),
            target_url=form.get("target_url", ""),
            mode=form.get("mode", "sync"),
            name=form.get("name", "").strip() or None,
            timeout_ms=int(timeout) if timeout else None,
            enabled=form.get("enabled") == "on",
        )
    except ValidationError as e:
        # The form comes back with what was typed and what is wrong with it.
        return _list(request, viewer, form, error=str(e))
    return render(request, "secret.html", viewer=viewer, hook=hook, secret=secret, created=True)


def _hook(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    hook_id = request.path_params["hook_id"]
    page = page_of(request)
    hook = memory.webhooks.get(hook_id)
    deliveries = memory.webhooks.deliveries(hook_id, limit=PAGE + 1, offset=(page - 1) * PAGE)
    return render(
        request,
        "webhook.html",
        viewer=viewer,
        hook=hook,
        deliveries=deliveries[:PAGE],
        more=len(deliveries) > PAGE,
        page=page,
    )


def _switch(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    hook_id = request.path_params["hook_id"]
    if form.get("enabled") == "yes":
        memory.webhooks.enable(hook_id)
        return see_other(request, _hook_path(hook_id), done="hook_enabled")
    memory.webhooks.disable(hook_id)
    return see_other(request, _hook_path(hook_id), done="hook_disabled")


def _rotate(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    hook_id = request.path_params["hook_id"]
    grace = form.get("grace_seconds", "0").strip() or "0"
    if not grace.isdigit():
        raise ValidationError("grace_seconds: expected a whole number of seconds")
    asked = confirm(
        request,
        viewer,
        form,
        title="Rotate the signing secret",
        consequence="A new secret signs every delivery from now on; it is shown once, on the "
        "next page. "
        + (
            f"The old secret also signs for {int(grace)} more seconds."
            if int(grace)
            else "The old secret stops signing at once."
        ),
        fields=("grace_seconds",),
        cancel=_hook_path(hook_id),
    )
    if asked is not None:
        return asked
    secret = memory.webhooks.rotate_secret(hook_id, grace_seconds=int(grace))
    hook = memory.webhooks.get(hook_id)
    return render(request, "secret.html", viewer=viewer, hook=hook, secret=secret, created=False)


def _delete(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    hook_id = request.path_params["hook_id"]
    hook = memory.webhooks.get(hook_id)
    asked = confirm(
        request,
        viewer,
        form,
        title=f"Delete webhook {hook.name}",
        consequence="No more deliveries are made to it, and its delivery log goes with it.",
        fields=(),
        cancel=_hook_path(hook_id),
    )
    if asked is not None:
        return asked
    memory.webhooks.delete(hook_id)
    return see_other(request, "/webhooks", done="hook_deleted")


HOOK = "/webhooks/{hook_id:path}"

routes = [
    Route("/webhooks", endpoint(_index), methods=["GET"]),
    Route("/webhooks", endpoint(_create, post=True), methods=["POST"]),
    Route(HOOK + "/enabled", endpoint(_switch, post=True), methods=["POST"]),
    Route(HOOK + "/rotate", endpoint(_rotate, post=True), methods=["POST"]),
    Route(HOOK + "/delete", endpoint(_delete, post=True), methods=["POST"]),
    Route(HOOK, endpoint(_hook), methods=["GET"]),
]
