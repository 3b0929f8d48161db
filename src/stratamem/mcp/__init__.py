"""stratamem as the memory of any agent, over the Model Context Protocol (docs/mcp.md).

``stratamem mcp`` serves it over stdio for one user; ``stratamem serve`` mounts it at
``/mcp`` (streamable HTTP), authenticated with the project's API key, the user named by the
URL (``/mcp/users/{user_id}``). Both need the ``mcp`` package (``pip install
'stratamem[mcp]'``, part of ``stratamem[server]``), imported only when a server is made: it
takes over a second to import.
"""

from __future__ import annotations

from ..api import MemoryAPI
from ._tools import MemoryTools

__all__ = ["MemoryTools", "serve_stdio"]


def serve_stdio(memory: MemoryAPI, user_id: str) -> None:
    """Serve ``memory`` to one MCP host over stdin/stdout, for ``user_id``, until the host
    closes the pipe. Nothing else may write to stdout meanwhile (logs go to stderr)."""
    tools = MemoryTools(memory, user_id)
    from ._server import build_server

    build_server(lambda _request: tools).run("stdio")
