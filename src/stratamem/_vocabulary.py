"""The closed sets of values stratamem stores: one ``Literal`` each, shared by the rows that
cross the store's port (``store/_rows.py``) and the public types (``types.py``), so that a
row read back converts to its public model without a check the type checker cannot see."""

from __future__ import annotations

from typing import Literal

__all__ = [
    "AuditAction",
    "DeliveryStatus",
    "FactKind",
    "FactStatus",
    "ItemKind",
    "MessageStatus",
    "RecallOutcome",
    "RecallSource",
    "SummaryStatus",
    "UiSessionKind",
    "WebhookEvent",
    "WebhookMode",
    "WebhookResource",
]

MessageStatus = Literal["pending", "processed", "failed"]
FactStatus = Literal["active", "superseded"]
# ``instruction``: a standing instruction to the assistant ("always give me a code example
# when I ask about async error handling"); see docs/recall.md#standing-instructions.
FactKind = Literal[
    "fact", "preference", "plan", "constraint", "event", "identity", "behaviour", "instruction"
]
SummaryStatus = Literal["active", "deprioritized", "archived", "deleted", "superseded"]
AuditAction = Literal["set_status", "forget", "erase_user"]
WebhookResource = Literal["fact", "summary", "topic"]
WebhookEvent = Literal["before_llm", "after_llm", "before_add"]
WebhookMode = Literal["sync", "async"]
DeliveryStatus = Literal["delivered", "failed", "retrying"]
ItemKind = Literal["message", "fact", "summary", "topic"]  # the four layers' items
UiSessionKind = Literal["key", "admin"]  # how a dashboard sign-in was made
# The recall log (docs/recall.md#the-recall-log): which face recalled, and what came of it
# (``injected``: a block went in; ``none``: nothing relevant; ``skipped``: the recall ran
# past its bound or failed, so the call went on without memory).
RecallSource = Literal["capture", "proxy", "rest"]
RecallOutcome = Literal["injected", "none", "skipped"]
