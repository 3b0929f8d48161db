"""Pages from templates, with memory text always rendered as text.

Jinja's autoescaping is on for every template and nothing is ever marked safe: a memory
that says ``<script>`` is shown as those characters. The responses also carry a Content
Security Policy that allows no script at all (the dashboard has none), so even a mistake in
a template could not run one.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ..types import NOTE_EVENT

__all__ = ["SECURITY_HEADERS", "href", "render"]

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _when(value: datetime | str | float | None) -> str:
    """A time as the dashboard shows it, in UTC to the minute; "—" for none."""
    if value is None or value == "":
        return "—"
    if isinstance(value, (int, float)):
        at = datetime.fromtimestamp(value, timezone.utc)
    elif isinstance(value, str):
        try:
            at = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    else:
        at = value
    if at.tzinfo is not None:
        at = at.astimezone(timezone.utc)
    return at.strftime("%Y-%m-%d %H:%M UTC")


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} ms"


def _plural(n: float, one: str, many: str | None = None) -> str:
    """The noun for ``n`` of it: ``one`` for 1, else ``many`` (``one`` + "s" by default).
    Templates write ``{{ n }} {{ n|plural("summary", "summaries") }}``."""
    return one if n == 1 else many or one + "s"


_env = Environment(
    loader=PackageLoader("stratamem.ui", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["when"] = _when
_env.filters["ms"] = _ms
_env.filters["plural"] = _plural
_env.globals["NOTE_EVENT"] = NOTE_EVENT
_env.filters["q"] = lambda s: quote(str(s), safe="")


def href(request: Request, path: str, **params: Any) -> str:
    """A dashboard URL: ``path`` under the dashboard's mount, with query ``params`` (those
    that are ``None`` or empty left out)."""
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return f"{request.scope.get('root_path', '')}{path}" + (f"?{query}" if query else "")


# What a redirect after an action says it did: a code in ``?done=``, never free text (a
# link could otherwise make the dashboard say anything). "{n}" takes the code's number,
# "{s}" the plural ending it needs.
_NOTICES = {
    "retried": "{n} job{s} queued again.",
    "status": "Status changed; the change is in the history below.",
    "forgotten": "Forgotten: {n} item{s} removed.",
    "erased": "The user was erased.",
    "hook_enabled": "Webhook enabled.",
    "hook_disabled": "Webhook disabled.",
    "hook_deleted": "Webhook deleted.",
    "signed_out": "Signed out.",
}


def _notice(code: str | None) -> str | None:
    if not code:
        return None
    name, _, number = code.partition(":")
    text = _NOTICES.get(name)
    if text is None or (number and not number.isdigit()):
        return None
    return text.format(n=number or "", s=_plural(int(number or 0), "", "s"))


def render(request: Request, template: str, code: int = 200, **context: Any) -> HTMLResponse:
    viewer = context.pop("viewer", None)
    body = _env.get_template(template).render(
        request=request,
        viewer=viewer,
        notice=_notice(request.query_params.get("done")),
        base=request.scope.get("root_path", ""),
        href=lambda path, **params: href(request, path, **params),
        **context,
    )
    return HTMLResponse(body, status_code=code)
