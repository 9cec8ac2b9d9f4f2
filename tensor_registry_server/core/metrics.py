"""Prometheus metrics that an operator pages on, beside the HTTP ones
(tensor_registry_server.middleware) and the
blob bytes served (tensor_registry_server.blobs.service, the download bytes).

Two kinds:
- Counters incremented where the event happens in this API process (resolves, key issues,
  signed-URL failures, upload bytes). With N replicas, Prometheus sums them across instances.
- Job and worker figures read from the database at scrape time
(tensor_registry_server.system.metrics): jobs end
  in worker processes, and every replica reads the same rows, so these agree across replicas
  (aggregate them with ``max``, not ``sum``). Job durations and throughputs are observed into
  the histograms below once per finished job, when a scrape first sees it.

Fleet figures come from node check-ins (tensor_registry_server.nodes): the nodes live and stale
and, per alias,
the live nodes watching it and those warm on its current version, read from the database at
scrape time like the job figures (aggregate with ``max``); load seconds are observed by the
replica that takes a check-in reporting a load it has not seen (sum them across replicas).

Model names are labels only where the operator opts in (``metrics.model_labels``): /metrics
needs no token, and names are registry data. Otherwise every such series reads
``model="all"``. Opted in, per-model labels are bounded: the first ``MODEL_LABEL_LIMIT``
models a process sees keep their name, every later one is counted as ``other``, so a registry
with thousands of models cannot blow up the series count.
"""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram

MODEL_LABEL_LIMIT = 100
OTHER_MODEL = "other"
# The model label when names are not shown (the default).
ALL_MODELS = "all"

RESOLVES = Counter(
    "tensor_registry_resolves_total",
    "Successful resolves, by model and whether the choice came from the resolve cache",
    ["model", "cache"],
)
KEY_ISSUES = Counter(
    "tensor_registry_key_issues_total",
    "Key URLs minted by resolve (keys:read), by model",
    ["model"],
)
SIGNED_URL_FAILURES = Counter(
    "tensor_registry_signed_url_failures_total",
    "Signed blob/key URLs refused, by purpose and reason (expired, invalid)",
    ["purpose", "reason"],
)
UPLOAD_BYTES = Counter(
    "tensor_registry_upload_bytes_total", "Bytes received in version file upload bodies"
)

# Namespace usage and limits (issue 36 §2), read from the rows at scrape: who is near a limit.
# A limit series is absent while that limit is off (unlimited). Labelled by namespace only when
# metrics.model_labels is on (an anonymous scrape learns no names); else namespace="all" sums
# the usage and NAMESPACES_NEAR_LIMIT still says that someone is near a limit.
NAMESPACE_STORAGE = Gauge(
    "tensor_registry_namespace_storage_bytes",
    "Bytes stored by the namespace (sources and artifacts)",
    ["namespace"],
)
NAMESPACE_STORAGE_LIMIT = Gauge(
    "tensor_registry_namespace_storage_limit_bytes", "The namespace's storage quota", ["namespace"]
)
NAMESPACE_UPLOAD_LIMIT = Gauge(
    "tensor_registry_namespace_upload_limit_bytes",
    "The namespace's largest upload",
    ["namespace"],
)
NAMESPACES_NEAR_LIMIT = Gauge(
    "tensor_registry_namespaces_near_limit",
    "Namespaces using 90% or more of their storage quota or concurrent jobs",
)
NAMESPACE_JOBS = Gauge(
    "tensor_registry_namespace_active_jobs", "Jobs queued or running, by namespace", ["namespace"]
)
NAMESPACE_JOBS_LIMIT = Gauge(
    "tensor_registry_namespace_jobs_limit",
    "The namespace's limit of concurrent jobs",
    ["namespace"],
)

JOBS = Gauge(
    "tensor_registry_jobs",
    "Jobs queued or running now, by kind and state (database, at scrape)",
    ["kind", "state"],
)
JOBS_FINISHED = Counter(
    "tensor_registry_jobs_finished_total",
    "Jobs that reached a final state (succeeded, failed, cancelled) since this process started",
    ["kind", "state"],
)
QUEUE_DEPTH = Gauge(
    "tensor_registry_job_queue_depth", "Jobs waiting for a worker, by queue", ["queue"]
)
OLDEST_QUEUED = Gauge(
    "tensor_registry_job_oldest_queued_seconds",
    "Age of the oldest job waiting for a worker, by queue (0 when none waits)",
    ["queue"],
)
JOB_DURATION = Histogram(
    "tensor_registry_job_duration_seconds",
    "Wall time of finished jobs from start to final state (last attempt)",
    ["kind", "state"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200),
)
JOB_THROUGHPUT = Histogram(
    "tensor_registry_job_throughput_bytes_per_second",
    "Throughput of succeeded jobs that moved bytes (tensorize: its serialize stage)",
    ["kind"],
    buckets=(1e6, 1e7, 5e7, 1e8, 2.5e8, 5e8, 1e9, 2e9, 4e9, 8e9, 16e9),
)
OLDEST_RUNNING = Gauge(
    "tensor_registry_job_oldest_running_seconds",
    "Age of the oldest running job since it started, by kind (0 when none runs)",
    ["kind"],
)
STALEST_PROGRESS = Gauge(
    "tensor_registry_job_progress_age_seconds",
    "Longest time a running job has gone without writing progress, by kind (0 when none "
    "runs): a hung job grows it",
    ["kind"],
)
WORKER_HEARTBEAT_AGE = Gauge(
    "tensor_registry_worker_heartbeat_age_seconds",
    "Seconds since each worker's last heartbeat, by opaque worker id (workers heard from in "
    "the last day): a silent worker grows it",
    ["worker"],
)
LIVE_WORKERS = Gauge(
    "tensor_registry_live_workers",
    "Workers whose heartbeat is recent, by capability (any, gpu_queue, cpu_queue, cuda, vllm, "
    "encryption)",
    ["capability"],
)
NODES = Gauge(
    "tensor_registry_nodes",
    "Nodes by check-in state: live (checked in within nodes.stale_after_seconds) or stale "
    "(silent longer, not yet forgotten)",
    ["state"],
)
NODES_WATCHING = Gauge(
    "tensor_registry_alias_nodes_watching",
    "Live nodes whose agent watches an alias, by model and alias (both 'all' unless "
    "metrics.model_labels)",
    ["model", "alias"],
)
NODES_WARM = Gauge(
    "tensor_registry_alias_nodes_warm",
    "Live nodes warm on an alias's current version, by model and alias (both 'all' unless "
    "metrics.model_labels): with tensor_registry_alias_nodes_watching, a rollout's progress",
    ["model", "alias"],
)
LOAD_SECONDS = Histogram(
    "tensor_registry_node_load_seconds",
    "Seconds of the loads and pulls nodes reported in check-ins (each load once), by path "
    "(engine, tensorizer, pull, other)",
    ["path"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
LOAD_PATHS = ("engine", "tensorizer", "pull")
DATABASE_UP = Gauge(
    "tensor_registry_metrics_database_up",
    "1 when the last scrape could read the job and worker figures from the database",
)


class BoundedLabels:
    """Label values admitted first-come up to ``limit``; the rest read as ``other``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._admitted: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._admitted:
            return value
        with self._lock:
            if len(self._admitted) < self.limit:
                self._admitted.add(value)
                return value
        return OTHER_MODEL


_bounded_model_label = BoundedLabels(MODEL_LABEL_LIMIT)
_bounded_alias_label = BoundedLabels(MODEL_LABEL_LIMIT)


def model_label(name: str, *, named: bool) -> str:
    """The ``model`` label for ``name``: itself (bounded) only when names are opted in."""
    return _bounded_model_label(name) if named else ALL_MODELS


def alias_labels(model: str, alias: str, *, named: bool) -> tuple[str, str]:
    """The ``model`` and ``alias`` labels of a fleet series: both bounded, and both ``all``
    unless names are opted in (alias names are registry data too)."""
    if not named:
        return ALL_MODELS, ALL_MODELS
    # Bounded per (model, alias) pair: a model's many aliases cannot grow the series either.
    admitted = _bounded_alias_label(f"{model}:{alias}") != OTHER_MODEL
    return _bounded_model_label(model), alias if admitted else OTHER_MODEL


def load_path_label(path: str) -> str:
    """A node names its own load path: only the known ones become labels."""
    return path if path in LOAD_PATHS else "other"


# Counters exist at 0 from the start (a rate() over a series that appears late misses its
# first increments, and an alert on "no resolves" needs the series).
for _cache in ("off", "hit", "miss"):
    RESOLVES.labels(ALL_MODELS, _cache)
KEY_ISSUES.labels(ALL_MODELS)
for _purpose in ("blob", "key"):
    for _reason in ("expired", "invalid"):
        SIGNED_URL_FAILURES.labels(_purpose, _reason)
for _path in (*LOAD_PATHS, "other"):
    LOAD_SECONDS.labels(_path)
for _state in ("live", "stale"):
    NODES.labels(_state)
