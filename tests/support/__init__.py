"""Helpers importable only by tests (tests/ is on sys.path under pytest)."""
