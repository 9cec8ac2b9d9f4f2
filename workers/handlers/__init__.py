"""The job handlers, one per task kind, each run by workers.jobrun behind a thin named task
(workers.tasks): tensorize, verify, import_version."""
