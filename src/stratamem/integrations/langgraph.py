"""LangGraph's long-term memory seam: a ``BaseStore`` backed by stratamem.

    from stratamem.integrations.langgraph import StratamemStore

    store = StratamemStore(mem, user_index=1)  # namespaces ("memories", "<user id>")
    graph = builder.compile(store=store)

Needs ``pip install 'stratamem[langgraph]'``; see docs/integrations/langgraph.md.
"""

from __future__ import annotations

try:
    import langgraph.store.base  # noqa: F401  (the seam itself)
except ImportError as exc:  # pragma: no cover - tested in a subprocess
    raise ImportError(
        "stratamem.integrations.langgraph needs LangGraph: pip install 'stratamem[langgraph]'"
    ) from exc

from ._langgraph import REFRESH_SLACK, StratamemStore

__all__ = ["REFRESH_SLACK", "StratamemStore"]
