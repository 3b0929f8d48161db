"""The store core: the memory's rules written once, over a small SQL dialect."""
