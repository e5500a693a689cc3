"""Shared pytest helpers (fixtures are imported by tests/conftest.py)."""
