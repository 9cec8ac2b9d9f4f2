"""What the registry and the node both read and write: the layout manifest, the signed
statements and the variant. Pure data and checks: no HTTP, no database, no torch."""
