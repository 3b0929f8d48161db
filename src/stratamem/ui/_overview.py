"""The overview: what the project holds, what is failing or paused, two charts of the last
hours, and what memory cost over the last days."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..memory import Memory
from ..types import WebhookDelivery
from ._charts import bar_chart
from ._render import render
from ._signin import Viewer
from ._view import Form, confirm, endpoint, see_other

__all__ = ["routes"]

_HOURS = 48
_COST_DAYS = 14
_FAILED_SHOWN = 20
_DELIVERIES_SCANNED = 50  # per webhook: the recent end of its log


def _webhook_failures(memory: Memory) -> list[WebhookDelivery]:
    failed = [
        d
        for hook in memory.webhooks.list(limit=100)
        for d in memory.webhooks.deliveries(hook.id, limit=_DELIVERIES_SCANNED)
        if d.status == "failed"
    ]
    return sorted(failed, key=lambda d: d.at, reverse=True)[:_FAILED_SHOWN]


def _overview(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    stats = memory.stats()
    activity = memory.activity(hours=_HOURS, bucket_minutes=60)
    latency = memory.recall_log.latency(hours=_HOURS, bucket_minutes=60)
    hours = [b.start.strftime("%d %H:00") for b in activity]
    processed = bar_chart(
        "Messages processed per hour",
        "",
        hours,
        [
            ("processed", [b.messages_processed for b in activity]),
            ("failed", [b.messages_failed for b in activity]),
        ],
    )
    # The log leaves hours without a recall out; the chart keeps their place, empty.
    by_hour = {b.bucket_start: b for b in latency}
    recalled = [by_hour.get(b.start) for b in activity]
    recall = bar_chart(
        "Recall latency per hour",
        " ms",
        hours,
        [
            ("p50", [None if r is None else r.p50_ms for r in recalled]),
            ("p95", [None if r is None else r.p95_ms for r in recalled]),
        ],
    )
    usage = memory.usage(days=_COST_DAYS)
    cost_chart = bar_chart(
        "Pipeline tokens per processed message, per day",
        " tokens",
        [d.day.isoformat() for d in usage.days],
        [("tokens per message", [d.tokens_per_message for d in usage.days])],
        axis="Day (UTC)",
    )
    return render(
        request,
        "overview.html",
        usage=usage,
        cost_chart=cost_chart,
        viewer=viewer,
        stats=stats,
        failed=memory.messages.list(status="failed", limit=_FAILED_SHOWN),
        webhook_failures=_webhook_failures(memory),
        charts=[processed, recall],
        recalls=sum(b.count for b in latency),
        skipped=sum(b.skipped for b in latency),
    )


def _retry(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    user_id = form.get("user_id") or None
    asked = confirm(
        request,
        viewer,
        form,
        title="Retry failed messages",
        consequence=(
            f"Every failed message of {user_id} will be processed again."
            if user_id
            else "Every failed message of this project will be processed again."
        ),
        fields=("user_id",),
        cancel="/",
        danger=False,
    )
    if asked is not None:
        return asked
    jobs = memory.retry_failed(user_id)
    return see_other(request, "/", done=f"retried:{jobs}")


routes = [
    Route("/", endpoint(_overview), methods=["GET"]),
    Route("/retry", endpoint(_retry, post=True), methods=["POST"]),
]
