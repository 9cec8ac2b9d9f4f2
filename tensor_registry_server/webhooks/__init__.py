"""Webhooks: namespace-scoped subscriptions to events, delivered signed (Standard Webhooks)."""
