"""ceiling: how fast an LLM deployment can go, how fast it goes, and where the gap goes."""

__version__ = "0.1.0"
