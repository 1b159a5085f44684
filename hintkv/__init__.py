"""hintkv: an LLM inference server for agent swarms whose KV cache follows what the agents do."""

__version__ = "0.1.0"
