"""Cross-cutting pieces every domain may use; nothing here imports a domain."""
