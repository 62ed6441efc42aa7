"""The trace stage: every episode recorded as typed JSONL records (`records`), shown by the viewer (`viewer/`) and
played again by `replay`."""
