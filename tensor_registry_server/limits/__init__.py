"""Per-namespace limits and per-token request rates (issue 36 §2)."""
