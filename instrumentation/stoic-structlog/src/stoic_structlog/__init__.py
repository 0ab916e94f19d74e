"""stoic adapter (work in progress)."""
