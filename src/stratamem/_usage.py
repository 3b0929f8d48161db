"""What memory costs: the pipeline's model calls of a project per day and model, their
tokens, and their price when the ``llm_prices`` setting has one (``mem.usage``).

Every model call of the pipeline is stored with its tokens when its batch commits or fails
(``store/_core/layers.py``, ``record_calls``); this reads them back per UTC day, beside the
messages processed that day, so that the cost of memory per message can be watched.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import date, timedelta

from ._checks import int_problem
from .config import ModelPrice
from .errors import ValidationError
from .store import MetaStore, UsageDayRow
from .types import DayUsage, ModelUsage, Usage

__all__ = ["MAX_DAYS", "price_of", "usage"]

MAX_DAYS = 366
_PER = 1_000_000  # prices are per 1M tokens
_EPOCH = date(1970, 1, 1)


def price_of(prices: Mapping[str, ModelPrice], model: str) -> ModelPrice | None:
    """The price of ``model`` (``openai:gpt-4o-mini``): under that name, else under the
    name without its provider (``gpt-4o-mini``)."""
    found = prices.get(model)
    if found is None and ":" in model:
        found = prices.get(model.partition(":")[2])
    return found


def _model(rows: list[UsageDayRow], model: str, prices: Mapping[str, ModelPrice]) -> ModelUsage:
    prompt = sum(r.prompt_tokens for r in rows)
    completion = sum(r.completion_tokens for r in rows)
    price = price_of(prices, model)
    cost = None
    if price is not None:
        cost = (prompt * price.prompt + completion * price.completion) / _PER
    return ModelUsage(
        model=model,
        calls=sum(r.calls for r in rows),
        failed=sum(r.failed for r in rows),
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost=cost,
    )


def _priced(models: list[ModelUsage]) -> float | None:
    costs = [m.cost for m in models if m.cost is not None]
    return sum(costs) if costs else None


def usage(
    store: MetaStore, project_id: str, prices: Mapping[str, ModelPrice], *, days: int
) -> Usage:
    """The project's last ``days`` UTC days, today included."""
    problem = int_problem(days, 1, MAX_DAYS)
    if problem is not None:
        raise ValidationError("invalid usage window", [f"days: {problem} (got {days!r})"])
    today = int(time.time() // 86400)  # UTC days since the epoch
    first = _EPOCH + timedelta(days=today - days + 1)
    since = (today - days + 1) * 86400
    rows, processed = store.usage_by_day(project_id, float(since))
    by_day: dict[str, list[UsageDayRow]] = {}
    by_model: dict[str, list[UsageDayRow]] = {}
    for r in rows:
        by_day.setdefault(r.day, []).append(r)
        by_model.setdefault(r.model, []).append(r)
    out: list[DayUsage] = []
    for i in range(days):
        day = first + timedelta(days=i)
        key = day.isoformat()
        models = [_model([r], r.model, prices) for r in by_day.get(key, [])]
        prompt = sum(m.prompt_tokens for m in models)
        completion = sum(m.completion_tokens for m in models)
        n = processed.get(key, 0)
        out.append(
            DayUsage(
                day=day,
                messages_processed=n,
                prompt_tokens=prompt,
                completion_tokens=completion,
                tokens_per_message=round((prompt + completion) / n, 1) if n else None,
                cost=_priced(models),
                models=models,
            )
        )
    totals = [_model(rs, model, prices) for model, rs in sorted(by_model.items())]
    return Usage(
        since=first,
        days=out,
        models=totals,
        prompt_tokens=sum(m.prompt_tokens for m in totals),
        completion_tokens=sum(m.completion_tokens for m in totals),
        messages_processed=sum(d.messages_processed for d in out),
        cost=_priced(totals),
        unpriced=[m.model for m in totals if m.cost is None],
    )
