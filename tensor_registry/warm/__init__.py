"""Warm state on a node: restoring vLLM compile caches and reporting hit or miss."""
