"""AutoGen's memory seam: an ``autogen_core.memory.Memory`` backed by stratamem, for
``AssistantAgent(memory=[...])`` and any agent that calls ``update_context``.

    from autogen_agentchat.agents import AssistantAgent
    from stratamem.integrations.autogen import StratamemMemory

    agent = AssistantAgent("assistant", model_client, memory=[StratamemMemory(mem, user_id="u1")])

Needs ``pip install 'stratamem[autogen]'``; see docs/integrations/autogen.md.
"""

from __future__ import annotations

try:
    import autogen_core.memory  # noqa: F401  (the seam itself)
except ImportError as exc:  # pragma: no cover - tested in a subprocess
    raise ImportError(
        "stratamem.integrations.autogen needs AutoGen: pip install 'stratamem[autogen]'"
    ) from exc

from ._autogen import RECALL_CONFIG, StratamemMemory

__all__ = ["RECALL_CONFIG", "StratamemMemory"]
