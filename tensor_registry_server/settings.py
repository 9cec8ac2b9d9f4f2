"""The one place settings are read.

Every value comes from the environment (prefix ``TENSOR_REGISTRY_``, nested groups joined with
``__``, e.g. ``TENSOR_REGISTRY_DATABASE__URL``) or from defaults that make ``tensor-registry serve``
work on a bare machine: SQLite file, local storage directory and a file-system broker, all under
``data_dir``. Secrets are ``SecretStr`` so that they never show up in a repr or a log line.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import socket
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, PrivateAttr, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

StorageBackendName = Literal["local", "s3", "redis"]


class DatabaseSettings(BaseModel):
    # Default: a SQLite file under data_dir (see Settings.database_url).
    url: str | None = None
    echo: bool = False
    pool_size: int = 10


class S3Settings(BaseModel):
    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    bucket: str = "tensor-registry"
    prefix: str = ""
    addressing_style: Literal["path", "virtual", "auto"] = "path"
    multipart_chunk_mb: int = 64
    # Presigned GETs are handed to serving nodes directly; the registry proxies only what a
    # presigned URL cannot express (tensor-parallel %03d templates).
    presign_downloads: bool = True


class RedisStorageSettings(BaseModel):
    # No default address: an unset URL means the redis backend is not configured (it used to
    # default to 127.0.0.1:6379 and write into whatever Redis answered there).
    url: str | None = None
    # Namespace for every key this backend writes (the server may be shared with the broker).
    prefix: str = "tensor-registry/"
    # Objects are split into strings of this size (tensorizer's redis:// chunk layout).
    chunk_mb: int = 16


class StorageSettings(BaseModel):
    default_backend: StorageBackendName = "local"
    # The backends jobs and uploads may name. None: the default one, plus local when
    # local_root is set, s3 when s3.endpoint_url or s3.access_key_id is set, and redis when
    # redis.url is set. Anything else is refused (422 storage_not_configured).
    backends: list[StorageBackendName] | None = None
    # Default: data_dir / "storage".
    local_root: Path | None = None
    s3: S3Settings = Field(default_factory=S3Settings)
    redis: RedisStorageSettings = Field(default_factory=RedisStorageSettings)
    # How old a storage's last health check may be before a request starts another in the
    # background (tensor_registry_server/storage/registry.py); also the Retry-After of a 503
    # storage_unavailable.
    recheck_seconds: float = Field(default=10.0, ge=0.05, le=3600)
    # How long one health check of a storage may take before it counts as down.
    check_timeout_seconds: float = Field(default=3.0, gt=0, le=300)
    max_upload_bytes: int = 200 * 1024**3
    # Finalize reads each safetensors header whole. Real checkpoints stay far below this: a
    # 70B model's shards carry well under 1 MiB of header each (about 100 bytes per tensor);
    # the safetensors format itself allows up to 100 MB.
    max_safetensors_header_bytes: int = 16 * 1024**2
    # Allow-listed roots for file:// imports; empty means file:// imports are refused.
    import_roots: list[Path] = Field(default_factory=list)

    @property
    def configured(self) -> list[str]:
        """The backends that may be used, in a fixed order (the default among them)."""
        if self.backends is not None:
            names = {*self.backends, self.default_backend}
        else:
            names = {self.default_backend}
            if self.local_root is not None:
                names.add("local")
            if self.s3.endpoint_url or self.s3.access_key_id is not None:
                names.add("s3")
            if self.redis.url:
                names.add("redis")
        return [name for name in ("local", "s3", "redis") if name in names]

    @model_validator(mode="after")
    def _redis_needs_an_address(self) -> StorageSettings:
        if "redis" in self.configured and not self.redis.url:
            raise ValueError(
                "storage.redis.url is required to use the redis backend "
                "(TENSOR_REGISTRY_STORAGE__REDIS__URL); there is no default address"
            )
        return self


class BrokerSettings(BaseModel):
    # Default: kombu's file-system transport under data_dir, which needs no server.
    url: str | None = None
    # Redis for job-event pub/sub and the resolve cache; None in the embedded default.
    redis_url: str | None = None
    # Prefix of every key the Celery broker writes in Redis, so several registries (or test
    # runs) can share one Redis database without taking each other's messages.
    key_prefix: str = ""
    # Backstop lifetime of a cached resolve choice (invalidation is by per-model generation).
    resolve_cache_ttl_seconds: int = 60


class SecuritySettings(BaseModel):
    # HMAC key for signed blob/key URLs and the master key wrapping artifact keys. In the
    # embedded default each is generated once into its own file, data_dir/secrets/signing.key
    # and master.key (mode 0600, directory 0700, never under a storage or import root); scaled
    # deployments must set them so every replica agrees.
    signing_key: SecretStr | None = None
    master_key: SecretStr | None = None
    admin_token: SecretStr | None = None
    max_url_ttl_seconds: int = 24 * 3600
    default_url_ttl_seconds: int = 600
    # Ed25519 key signing artifact manifests (base64 of the 32-byte seed;
    # tensor_registry_server/trust/signing_keys.py). Embedded default: generated once into
    # data_dir/secrets/manifest-signing.key (0600).
    manifest_signing_key: SecretStr | None = None
    # The registry's stable identity, what nodes pin keys and alias state under (never its
    # URL or port). Embedded default: generated once into data_dir/secrets/registry-id;
    # deployments with several API/worker hosts set it, as they set the signing key.
    registry_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{8,64}$")
    # Rotation: earlier private keys (verify + endorse the active key, never sign) and earlier
    # public keys (base64, verify only). All are published at /.well-known/tensor-registry/keys.
    manifest_previous_keys: list[SecretStr] = Field(default_factory=list)
    manifest_retired_public_keys: list[str] = Field(default_factory=list)
    # ECDSA P-256 key signing model.sig, the OpenSSF Model Signing signature (a PEM private key,
    # or the base64 of its PEM or DER; tensor_registry_server/trust/signing_keys.py). Embedded
    # default: generated once
    # into
    # data_dir/secrets/model-signing.key (0600). Rotation: earlier keys' public PEMs, still
    # published so the model.sig files they signed keep verifying.
    model_signing_key: SecretStr | None = None
    model_signing_previous_public_keys: list[str] = Field(default_factory=list)
    # Other registries' public keys (base64): a registered source that carries a signed
    # manifest (an exported bundle) must verify with one of these or this registry's keys.
    trusted_manifest_keys: list[str] = Field(default_factory=list)
    # Peers (IPs/CIDRs) whose X-Forwarded-For is believed: the load balancer. Empty: the
    # client address is always the TCP peer.
    trusted_proxies: list[str] = Field(default_factory=list)


class FetchSettings(BaseModel):
    """The guarded outbound fetcher (tensor_registry_server/core/fetch.py; docs/security.md)."""

    # Host names and IPs/CIDRs that may be fetched although they are internal (loopback,
    # private, link-local, ...); empty: every internal address is refused.
    allow: list[str] = Field(default_factory=list)
    # s3:// sources that may be imported/registered from: "bucket" or "bucket/prefix/". Empty:
    # none. The registry's own bucket (storage.s3.bucket) is refused whatever this says.
    s3_allow: list[str] = Field(default_factory=list)
    # Caps of one fetch (one file): bytes, the whole fetch, connect, and an idle read.
    max_bytes: int = 200 * 1024**3
    total_seconds: float = 4 * 3600.0
    connect_seconds: float = 10.0
    read_seconds: float = 60.0
    max_redirects: int = 5


class HttpSettings(BaseModel):
    """Bounds `serve` puts on each client connection (tensor_registry_server/blobs/zerocopy.py
    enforces them)."""

    # Request line plus headers; past it the answer is 431 and the connection closes.
    max_header_bytes: int = 64 * 1024
    # From a request's first byte (or the connection's start) to the end of its headers: 408.
    header_timeout_seconds: float = 30.0
    # Longest pause between two pieces of a request body (not counting pauses the server
    # makes while the app catches up): the app answers 408 and the connection closes.
    body_idle_timeout_seconds: float = 60.0
    # Threads that send blob bytes (os.sendfile), so downloads are not capped at the event
    # loop's one core (bench/engine/url_ceiling.py); 0 sends on the loop. When all are busy the next
    # file goes out on the loop. 32: the engine's readers hold two connections each (the next
    # span asked while the current one ends), and a thread exists only once a send needs it.
    sendfile_threads: int = Field(default=32, ge=0, le=1024)
    # Longest a download may wait for its client to take more bytes before it is cut off (the
    # kernel's send timeout on the sending thread: a stalled client goes within one to a few
    # times it).
    send_idle_timeout_seconds: float = Field(default=60.0, gt=0)
    # Event streams (SSE: GET /api/v1/events and job event streams, counted together) one
    # token may hold open on one API process; past it 429 too_many_event_streams. A fleet whose
    # agents share one token (the Helm DaemonSet's) holds one stream per agent: at 8, 64 agents
    # behind two replicas had 48 refused, polling instead of being told (bench/results/fleet.md).
    # Size it to the agents per replica; each stream is a socket and a token check every
    # stream_token_check_seconds.
    max_event_streams_per_token: int = Field(default=256, ge=1)
    # How often an open stream checks that its token is still valid: a revoked or expired
    # token's streams end within this many seconds.
    stream_token_check_seconds: float = Field(default=5.0, gt=0)


class MetricsSettings(BaseModel):
    """What /metrics (unauthenticated: Prometheus scrapes it) may show."""

    # Label resolve and key-issue series with the model's name. Off: every series reads
    # model="all", so an anonymous scrape learns no namespace's model names (issue 26 §5).
    model_labels: bool = False


class WorkerSettings(BaseModel):
    queues: list[str] = Field(default_factory=lambda: ["gpu", "cpu"])
    concurrency: int = 1
    heartbeat_seconds: float = 10.0
    # A worker is live when its last heartbeat is younger than this.
    live_after_seconds: float = 60.0
    # Touched after every successful heartbeat: container health checks (docker-compose.yml,
    # the Helm chart) test its age. None: no file.
    alive_file: Path | None = None
    # Let CPU workers take tensorize jobs for models below this size (bytes of source weights).
    cpu_tensorize_max_bytes: int = 8 * 1024**3
    # Start one worker process beside the API in `serve`.
    embedded: bool = True
    # serve restarts its embedded worker when it dies, after this delay (doubling while it
    # keeps dying within a minute, up to 60 s).
    restart_backoff_seconds: float = 1.0
    # How often a running job writes its progress (and reads cancel_requested).
    progress_interval_seconds: float = 0.5
    # Attempts of one job, crash re-deliveries included, before it fails for good; transient
    # errors (storage or database unavailable) are retried after backoff * 2**n seconds.
    max_attempts: int = 5
    retry_backoff_seconds: float = 5.0
    # A job still 'queued' this long after it was last sent is sent again (lost message).
    resend_queued_after_seconds: float = 900.0
    # Bytes a verify job may fetch from a registered artifact's uri (all files together);
    # None: storage.max_upload_bytes.
    verify_max_bytes: int | None = None
    # Every worker sweeps orphaned bytes (left by crashes) this often; objects younger than
    # the grace period are never touched (an upload or a job may still be writing them).
    orphan_sweep_seconds: float = 3600.0
    orphan_grace_seconds: float = 3600.0
    # Warm jobs (docs/warm-state.md): vLLM is given the model at WARM_MODEL_ROOT/<artifact id>
    # (vLLM hashes that string: nodes serve from the same path to hit); None: DATA_DIR/warm-models.
    warm_model_root: Path | None = None
    # How long vLLM may take to start and answer the one request; the largest bundle kept.
    warm_timeout_seconds: float = 3600.0
    warm_max_bundle_bytes: int = 16 * 1024**3
    # Tests only: a folder where the suite arms stage holds
    # (tensor_registry_server/jobs/holds.py). None: off.
    hold_dir: Path | None = None


class RetentionSettings(BaseModel):
    """Garbage collection by retention policy (app/retention/, docs/retention.md).

    Off by default: GC removes versions only of models a policy covers (set per namespace or
    model through the API, or here for every model without one)."""

    # How often a worker runs GC (each worker; the deleting transactions make concurrent runs
    # safe). 0: never on a schedule (``tensor-registry gc`` still runs it by hand).
    gc_interval_seconds: float = Field(default=86400.0, ge=0)
    # The policy of every model that has none of its own or its namespace's. None: no default.
    default_keep_last: int | None = Field(default=None, ge=1)
    default_keep_days: float = Field(default=30.0, ge=0)


class EventsSettings(BaseModel):
    """The events outbox and its stream (tensor_registry_server/core/event_hub.py,
    docs/events.md)."""

    # How often each API process reads the outbox without being nudged: the fallback for a
    # lost Redis message (scaled) or for events the embedded worker commits (no Redis).
    poll_seconds: float = Field(default=5.0, gt=0)
    embedded_poll_seconds: float = Field(default=0.5, gt=0)
    # Events (and finished webhook deliveries) older than this are deleted, hourly: a stream or
    # webhook cursor older than that resumes at the oldest event kept.
    retention_days: float = Field(default=30.0, gt=0)


class WebhookSettings(BaseModel):
    """Webhook deliveries (tensor_registry_server/webhooks/delivery.py, docs/events.md)."""

    # Run the delivery loop in this API process (each replica takes due deliveries by
    # compare-and-set, so several replicas share the work without sending twice).
    deliver: bool = True
    # Tries of one delivery before it is given up (redeliver by hand after that).
    max_attempts: int = Field(default=8, ge=1, le=50)
    # Backoff before try n+1: base * 2**(n-1), capped, times a random factor in [0.5, 1].
    retry_base_seconds: float = Field(default=5.0, gt=0)
    retry_max_seconds: float = Field(default=3600.0, gt=0)
    # Consecutive failed tries (any delivery) after which the webhook is disabled.
    disable_after_failures: int = Field(default=20, ge=1)
    # One POST: connect + answer, whole.
    timeout_seconds: float = Field(default=10.0, gt=0)
    # Longest a replica holds a delivery it took before another may take it over.
    lease_seconds: float = Field(default=60.0, gt=0)
    # Webhooks per namespace.
    max_per_namespace: int = Field(default=50, ge=1)


class NodesSettings(BaseModel):
    """Node check-ins (tensor_registry_server/nodes, docs/events.md)."""

    # A node whose agent has not checked in for this long is stale: listed as such, left out
    # of rollouts (agents check in every 60 s and on every change).
    stale_after_seconds: float = Field(default=180.0, gt=0)
    # A node silent for this long is forgotten: its row is deleted (a decommissioned node does
    # not stay listed as stale forever).
    forget_after_seconds: float = Field(default=7 * 24 * 3600.0, gt=0)
    # Node rows one owner (the root of a token chain with its namespaces) may have, and all
    # owners together; a check-in that would add one past either is refused (429
    # too_many_nodes) until silent nodes are forgotten.
    max_per_owner: int = Field(default=1024, ge=1)
    max_total: int = Field(default=16384, ge=1)
    # The largest check-in body (413 checkin_too_large past it).
    max_checkin_bytes: int = Field(default=64 * 1024, ge=1024)


SsoRole = Literal["reader", "publisher", "operator", "admin"]


class SsoRoleRule(BaseModel):
    """One line of the role map: members of ``group`` hold ``role`` in ``namespaces``."""

    # A value of the ID token's groups claim (sso.groups_claim).
    group: str = Field(min_length=1)
    role: SsoRole
    # Namespaces, or ["*"] for every namespace. admin is registry-wide: only with ["*"].
    namespaces: list[str] = Field(default_factory=lambda: ["*"], min_length=1)

    @model_validator(mode="after")
    def _admin_is_registry_wide(self) -> SsoRoleRule:
        if self.role == "admin" and self.namespaces != ["*"]:
            raise ValueError("role admin is registry-wide: give it namespaces ['*']")
        return self


class SsoSettings(BaseModel):
    """Sign-in with OpenID Connect (sso/, people.py, docs/sso.md). Off while issuer is unset."""

    # The identity provider's issuer URL (its discovery document is issuer +
    # /.well-known/openid-configuration, fetched through the guarded fetcher: an internal
    # address must be allow-listed in fetch.allow).
    issuer: str | None = None
    client_id: str | None = None
    # None: a public client (PKCE alone); set for a confidential client (client_secret_post).
    client_secret: SecretStr | None = None
    # offline_access asks for a refresh token: how the registry re-checks a person's groups.
    scopes: list[str] = Field(
        default_factory=lambda: ["openid", "profile", "email", "offline_access"]
    )
    groups_claim: str = "groups"
    roles: list[SsoRoleRule] = Field(default_factory=list)
    # Lifetime of the registry session a sign-in gives (web UI and `login --sso`).
    session_seconds: int = Field(default=8 * 3600, ge=60)
    # How old a person's groups may be before the next use of their session or of a token
    # they minted asks the identity provider again (refresh token grant). Removing a person
    # from a group takes effect within this (plus the 5 s principal cache of resolve).
    recheck_seconds: float = Field(default=300.0, ge=0)
    # A sign-in must come back from the identity provider within this.
    login_seconds: int = Field(default=600, ge=30)
    clock_skew_seconds: int = Field(default=60, ge=0, le=600)
    # Discovery and JWKS are kept this long (a kid not in the cached set refetches at once).
    metadata_cache_seconds: float = Field(default=300.0, ge=0)

    @property
    def enabled(self) -> bool:
        return bool(self.issuer and self.client_id)


class LimitsSettings(BaseModel):
    # Defaults for every namespace; None: unlimited. An admin overrides them per namespace
    # (PUT /api/v1/namespaces/{ns}/limits). docs/limits.md.
    storage_bytes: int | None = Field(default=None, ge=0)
    upload_bytes: int | None = Field(default=None, ge=0)
    concurrent_jobs: int | None = Field(default=None, ge=0)
    # Per token (requests a second, token bucket of `rate_burst`); None: off. Shared by every
    # replica through broker.redis_url when set, else counted in this process.
    rate_per_second: float | None = Field(default=None, gt=0)
    rate_burst: int = Field(default=100, ge=1)


class AuditSettings(BaseModel):
    # How often the resolve audit's write-behind buffer commits (and rotates + fsyncs its WAL):
    # a host crash loses at most this much; a kill -9 of the process loses nothing.
    flush_seconds: float = Field(default=0.2, gt=0, le=3600)
    # How often a running replica looks for the WAL of a dead one to replay.
    sweep_seconds: float = Field(default=10.0, gt=0, le=3600)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TENSOR_REGISTRY_",
        env_nested_delimiter="__",
        extra="ignore",
    )

    data_dir: Path = Path("./data")
    # Base URL that serving nodes use to reach this registry (signed URLs are built on it).
    # None: derived from host/port (derive_public_url); set it behind a load balancer or TLS.
    public_url: str | None = None
    _public_url_derived: bool = PrivateAttr(default=False)
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "INFO"
    # The admin token given at first start (TENSOR_REGISTRY_ADMIN_TOKEN, as in docs/api.md).
    admin_token: SecretStr | None = None

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    fetch: FetchSettings = Field(default_factory=FetchSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    events: EventsSettings = Field(default_factory=EventsSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    nodes: NodesSettings = Field(default_factory=NodesSettings)
    sso: SsoSettings = Field(default_factory=SsoSettings)
    audit: AuditSettings = Field(default_factory=AuditSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @model_validator(mode="after")
    def _derive_public_url(self) -> Settings:
        # Filled in here so that every reader of `public_url` sees a string.
        if self.public_url is None:
            self.public_url = derive_public_url(self.host, self.port)
            self._public_url_derived = True
        return self

    @property
    def public_url_derived(self) -> bool:
        """True when public_url was not configured but derived from host/port."""
        return self._public_url_derived

    @property
    def public_base_url(self) -> str:
        return self.public_url or derive_public_url(self.host, self.port)

    @property
    def database_url(self) -> str:
        if self.database.url:
            return self.database.url
        return f"sqlite+aiosqlite:///{self.data_dir.resolve() / 'registry.db'}"

    @property
    def local_storage_root(self) -> Path:
        return (self.storage.local_root or self.data_dir / "storage").resolve()

    @property
    def audit_wal_dir(self) -> Path:
        """The resolve audit's write-ahead files (tensor_registry_server/resolve/audit_wal.py).
        Replicas that share it replay each other's rows after a kill -9."""
        return (self.data_dir / "audit-wal").resolve()

    @property
    def secrets_dir(self) -> Path:
        return (self.data_dir / "secrets").resolve()

    def check_layout(self) -> None:
        """Refuse to start when a storage or import root could hand out the secrets files.

        The local storage root may neither contain the secrets directory nor lie inside it; an
        import root may not contain the data dir (its database and secrets) nor lie inside the
        secrets directory.
        """
        secrets_dir = self.secrets_dir
        data_dir = self.data_dir.resolve()

        def overlaps(root: Path, protected: Path) -> bool:
            return root == protected or root in protected.parents or protected in root.parents

        storage = self.local_storage_root
        if overlaps(storage, secrets_dir):
            raise ValueError(
                f"storage.local_root ({storage}) overlaps the secrets directory ({secrets_dir}); "
                "point it elsewhere, e.g. the default data_dir/storage"
            )
        for root in self.storage.import_roots:
            root = root.resolve()
            if overlaps(root, secrets_dir) or root == data_dir or root in data_dir.parents:
                raise ValueError(
                    f"storage.import_roots entry {root} contains the data dir or the secrets "
                    f"directory ({secrets_dir}); list only directories holding model files"
                )

    @property
    def broker_url(self) -> str:
        if self.broker.url:
            return self.broker.url
        return "filesystem://"

    @property
    def broker_dir(self) -> Path:
        return (self.data_dir / "broker").resolve()

    @property
    def embedded_broker(self) -> bool:
        return self.broker_url.startswith("filesystem://")

    def signing_key_bytes(self) -> bytes:
        return _secret_bytes(self, "signing_key")

    def master_key_bytes(self) -> bytes:
        return _secret_bytes(self, "master_key")

    def bootstrap_admin_token(self) -> str | None:
        token = self.admin_token or self.security.admin_token
        return token.get_secret_value() if token else None


def derive_public_url(host: str, port: int) -> str:
    """The base URL a serving node can reach when the registry listens on ``host:port``.

    A wildcard address (0.0.0.0, ::, empty) is not an address a client can use, so the
    machine's fully qualified host name stands in for it; ``serve`` warns that public_url
    should be set in that case (load balancer, TLS, a name nodes resolve differently).
    """
    name = host.strip().strip("[]")
    if name in ("", "0.0.0.0", "::"):
        name = socket.getfqdn()
    try:
        if ipaddress.ip_address(name).version == 6:
            name = f"[{name}]"
    except ValueError:
        pass
    return f"http://{name}:{port}"


def _secret_bytes(settings: Settings, name: Literal["signing_key", "master_key"]) -> bytes:
    configured: SecretStr | None = getattr(settings.security, name)
    if configured is not None:
        return configured.get_secret_value().encode()
    return _local_secret(settings.data_dir.resolve(), name).encode()


SECRET_FILES = {"signing_key": "signing.key", "master_key": "master.key"}
# Where releases before the split kept both secrets; moved on first start (see _local_secret).
LEGACY_SECRETS_FILE = "secrets.json"


@lru_cache
def _local_secret(data_dir: Path, name: str) -> str:
    """A secret of the embedded default: its own file, mode 0600, in data_dir/secrets (0700).

    Created once; concurrent first starts (the API and its worker) agree because the file is
    published with link(), which fails for the loser. A data dir from an earlier release keeps
    its keys: they are taken from data_dir/secrets.json, which is removed once both are moved.
    """
    directory = data_dir / "secrets"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):  # an operator-made directory we do not own
        os.chmod(directory, 0o700)
    path = directory / SECRET_FILES[name]
    legacy = data_dir / LEGACY_SECRETS_FILE
    if not path.exists():
        value = None
        # Gone meanwhile means another process moved it: its file wins the link() below.
        with contextlib.suppress(FileNotFoundError):
            value = str(json.loads(legacy.read_text())[name])
        _publish_secret(path, value or secrets.token_urlsafe(48))
    if legacy.exists() and all((directory / f).exists() for f in SECRET_FILES.values()):
        legacy.unlink(missing_ok=True)
    value = path.read_text().strip()
    if len(value) < 32:
        raise RuntimeError(f"{path} holds no usable key (at least 32 characters are needed)")
    return value


def _publish_secret(path: Path, value: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        # link() fails if another process won the race; then its secret is the one.
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


@lru_cache
def get_settings() -> Settings:
    return Settings()
