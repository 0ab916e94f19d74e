"""Runnable examples: the traced demo service (python -m examples.demo)."""
