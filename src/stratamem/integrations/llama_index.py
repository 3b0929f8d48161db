"""LlamaIndex's memory seam: a memory block (``BaseMemoryBlock``) backed by stratamem, for
``llama_index.core.memory.Memory``.

    from llama_index.core.memory import Memory as LlamaMemory
    from stratamem.integrations.llama_index import StratamemMemoryBlock

    block = StratamemMemoryBlock(memory=mem, user_id="u1")
    chat_memory = LlamaMemory.from_defaults(session_id="thread-42", memory_blocks=[block])

Needs ``pip install 'stratamem[llama-index]'``; see docs/integrations/llama-index.md.
"""

from __future__ import annotations

try:
    import llama_index.core.memory  # noqa: F401  (the seam itself)
except ImportError as exc:  # pragma: no cover - tested in a subprocess
    raise ImportError(
        "stratamem.integrations.llama_index needs LlamaIndex: pip install 'stratamem[llama-index]'"
    ) from exc

from ._llama_index import RECALL_CONFIG, StratamemMemoryBlock

__all__ = ["RECALL_CONFIG", "StratamemMemoryBlock"]
