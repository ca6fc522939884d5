"""Test harnesses too large for conftest.py."""
