"""The vLLM loader plugin (`--load-format tensor-registry`): the entry point vLLM imports."""
