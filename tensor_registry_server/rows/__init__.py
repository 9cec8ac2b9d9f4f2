"""Every ORM row of the server, one module per domain (layer 2: rows only, no behaviour).

Domains share rows, never each other's folders: a service that counts a model's versions
reads ``tensor_registry_server.rows.versions``, not the versions domain (docs/architecture.md)."""
