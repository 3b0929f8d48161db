"""Versioned schema migrations, one directory per backend (SQL files named NNNN_name.sql)."""
