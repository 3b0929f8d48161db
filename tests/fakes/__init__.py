"""Test doubles of external services (real protocols on localhost, not mocks)."""

from .openai_server import FakeOpenAIServer, fake_vector

__all__ = ["FakeOpenAIServer", "fake_vector"]
