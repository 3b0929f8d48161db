"""Google ADK's memory seam: a ``BaseMemoryService`` backed by stratamem, for
``Runner(memory_service=...)`` and ADK's ``load_memory`` / ``PreloadMemoryTool``.

    from google.adk.runners import Runner
    from stratamem.integrations.google_adk import StratamemMemoryService

    runner = Runner(agent=agent, app_name="shop", session_service=sessions,
                    memory_service=StratamemMemoryService(mem, app_name="shop"))

Needs ``pip install 'stratamem[google-adk]'``; see docs/integrations/google-adk.md.
"""

from __future__ import annotations

try:
    import google.adk.memory  # noqa: F401  (the seam itself)
except ImportError as exc:  # pragma: no cover - tested in a subprocess
    raise ImportError(
        "stratamem.integrations.google_adk needs Google ADK: pip install 'stratamem[google-adk]'"
    ) from exc

from ._google_adk import StratamemMemoryService

__all__ = ["StratamemMemoryService"]
