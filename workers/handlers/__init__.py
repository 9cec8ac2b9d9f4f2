"""The job handlers, one per task kind, each run by workers.jobrun behind a thin named task
(workers.tasks): tensorize, verify, import_version. The two that make an artifact share one
attempt's prologue and epilogue (attempt.py); verify reads the registered uri with
registered_sources.py."""
