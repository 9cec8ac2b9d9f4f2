"""Celery workers: tensorize, verify and import tasks (torch lives here, not in the API)."""
