"""The job handlers, one per task kind, each run by tensor_registry_server.worker.jobrun behind a
thin named task
(tensor_registry_server.worker.tasks): tensorize, verify, import_version. The two that make an
artifact share one
attempt's prologue and epilogue (attempt.py); verify reads the registered uri with
registered_sources.py."""
