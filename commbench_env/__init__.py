"""CommBench-Env: a Gymnasium environment for multi-GPU communication code written by LLM agents."""

__version__ = "0.1.0"
