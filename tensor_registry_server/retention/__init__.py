"""Retention policies and the garbage collection that applies them."""
