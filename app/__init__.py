"""tensor-registry: a model registry for LLM weights serialized with tensorizer."""

__version__ = "0.1.0"
