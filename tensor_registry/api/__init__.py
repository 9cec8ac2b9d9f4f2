"""The registry's HTTP API as the node and the CLI call it (httpx): ``RegistryClient`` and the
problem+json answers as typed exceptions."""
