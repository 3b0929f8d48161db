"""The OpenAI Agents SDK's memory seams: a ``Session`` backed by stratamem, whose
``call_model_input_filter`` recalls long-term memory before each model call.

    from agents import RunConfig, Runner
    from stratamem.integrations.openai_agents import StratamemSession

    session = StratamemSession("thread-42", mem, user_id="u1")
    config = RunConfig(call_model_input_filter=session.call_model_input_filter)
    await Runner.run(agent, "What should I cook tonight?", session=session, run_config=config)

Needs ``pip install 'stratamem[openai-agents]'``; see docs/integrations/openai-agents.md.
"""

from __future__ import annotations

try:
    import agents.memory  # noqa: F401  (the seam itself)
except ImportError as exc:  # pragma: no cover - tested in a subprocess
    raise ImportError(
        "stratamem.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'stratamem[openai-agents]'"
    ) from exc

from ._openai_agents import RECALL_CONFIG, StratamemSession

__all__ = ["RECALL_CONFIG", "StratamemSession"]
