"""Signed artifact manifests: the registry's Ed25519 keys and the route that publishes them."""
