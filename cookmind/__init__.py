"""cookmind: a complete small-LLM stack, from raw web text to a chatting, aligned model."""

__version__ = "0.1.0"
