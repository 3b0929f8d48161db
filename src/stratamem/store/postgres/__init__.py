"""The backend at scale: PostgreSQL with tsvector full text and pgvector HNSW indexes.

Importing it needs psycopg (the ``postgres`` extra); ``import stratamem`` does not.
"""

from ._store import PostgresStore, has_store, latest_schema_version

__all__ = ["PostgresStore", "has_store", "latest_schema_version"]
