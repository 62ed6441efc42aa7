"""Golden semantics (filled by task issues)."""
