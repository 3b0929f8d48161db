"""Memory where agents are built: stratamem behind each framework's own seam for memory.

One module per framework (``stratamem.integrations.langgraph``, ...), each a thin adapter
over the public :class:`~stratamem.MemoryAPI`, so it works embedded (``Memory(...)``) and
against a server (``connect(url)``). Importing this package imports no framework; importing
a framework's module without the framework raises an ImportError naming the extra to
install (docs/integrations/).
"""
