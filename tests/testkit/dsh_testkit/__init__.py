"""Test-only plugins. Never mounted by a shipped example."""
