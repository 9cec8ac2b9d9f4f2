"""The one place settings are read.

Every value comes from the environment (prefix ``TENSOR_REGISTRY_``, nested groups joined with
``__``, e.g. ``TENSOR_REGISTRY_DATABASE__URL``) or from defaults that make ``tensor-registry serve``
work on a bare machine: SQLite file, local storage directory and a file-system broker, all under
``data_dir``. Secrets are ``SecretStr`` so that they never show up in a repr or a log line.
"""

from __future__ import annotations

import json
import os
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr
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
    url: str = "redis://127.0.0.1:6379/1"
    # Namespace for every key this backend writes (the server may be shared with the broker).
    prefix: str = "tensor-registry/"
    # Objects are split into strings of this size (tensorizer's redis:// chunk layout).
    chunk_mb: int = 16


class StorageSettings(BaseModel):
    default_backend: StorageBackendName = "local"
    # Default: data_dir / "storage".
    local_root: Path | None = None
    s3: S3Settings = Field(default_factory=S3Settings)
    redis: RedisStorageSettings = Field(default_factory=RedisStorageSettings)
    max_upload_bytes: int = 200 * 1024**3
    # Allow-listed roots for file:// imports; empty means file:// imports are refused.
    import_roots: list[Path] = Field(default_factory=list)


class BrokerSettings(BaseModel):
    # Default: kombu's file-system transport under data_dir, which needs no server.
    url: str | None = None
    # Redis for job-event pub/sub and the resolve cache; None in the embedded default.
    redis_url: str | None = None
    # Backstop lifetime of a cached resolve choice (invalidation is by per-model generation).
    resolve_cache_ttl_seconds: int = 60


class SecuritySettings(BaseModel):
    # HMAC key for signed blob/key URLs and the master key wrapping artifact keys. In the
    # embedded default both are generated once and kept in data_dir/secrets.json (mode 0600);
    # scaled deployments must set them so every replica agrees.
    signing_key: SecretStr | None = None
    master_key: SecretStr | None = None
    admin_token: SecretStr | None = None
    max_url_ttl_seconds: int = 24 * 3600
    default_url_ttl_seconds: int = 600
    # Ed25519 key signing artifact manifests (base64 of the 32-byte seed; app/trust/keys.py).
    # Embedded default: generated once into data_dir/secrets/manifest-signing.key (0600).
    manifest_signing_key: SecretStr | None = None
    # Rotation: earlier private keys (verify + endorse the active key, never sign) and earlier
    # public keys (base64, verify only). All are published at /.well-known/tensor-registry/keys.
    manifest_previous_keys: list[SecretStr] = Field(default_factory=list)
    manifest_retired_public_keys: list[str] = Field(default_factory=list)
    # Other registries' public keys (base64): a registered source that carries a signed
    # manifest (an exported bundle) must verify with one of these or this registry's keys.
    trusted_manifest_keys: list[str] = Field(default_factory=list)


class WorkerSettings(BaseModel):
    queues: list[str] = Field(default_factory=lambda: ["gpu", "cpu"])
    concurrency: int = 1
    heartbeat_seconds: float = 10.0
    # A worker is live when its last heartbeat is younger than this.
    live_after_seconds: float = 60.0
    # Let CPU workers take tensorize jobs for models below this size (bytes of source weights).
    cpu_tensorize_max_bytes: int = 8 * 1024**3
    # Start one worker process beside the API in `serve`.
    embedded: bool = True
    # How often a running job writes its progress (and reads cancel_requested).
    progress_interval_seconds: float = 0.5
    # Attempts of one job, crash re-deliveries included, before it fails for good; transient
    # errors (storage or database unavailable) are retried after backoff * 2**n seconds.
    max_attempts: int = 5
    retry_backoff_seconds: float = 5.0
    # A job still 'queued' this long after it was last sent is sent again (lost message).
    resend_queued_after_seconds: float = 900.0
    # Every worker sweeps orphaned bytes (left by crashes) this often; objects younger than
    # the grace period are never touched (an upload or a job may still be writing them).
    orphan_sweep_seconds: float = 3600.0
    orphan_grace_seconds: float = 3600.0


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TENSOR_REGISTRY_",
        env_nested_delimiter="__",
        extra="ignore",
    )

    data_dir: Path = Path("./data")
    # Base URL that serving nodes use to reach this registry (signed URLs are built on it).
    public_url: str = "http://127.0.0.1:8000"
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "INFO"
    # The admin token given at first start (TENSOR_REGISTRY_ADMIN_TOKEN, as in API.md).
    admin_token: SecretStr | None = None

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)

    @property
    def database_url(self) -> str:
        if self.database.url:
            return self.database.url
        return f"sqlite+aiosqlite:///{self.data_dir.resolve() / 'registry.db'}"

    @property
    def local_storage_root(self) -> Path:
        return (self.storage.local_root or self.data_dir / "storage").resolve()

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


def _secret_bytes(settings: Settings, name: Literal["signing_key", "master_key"]) -> bytes:
    configured: SecretStr | None = getattr(settings.security, name)
    if configured is not None:
        return configured.get_secret_value().encode()
    return _local_secrets(settings.data_dir.resolve())[name].encode()


@lru_cache
def _local_secrets(data_dir: Path) -> dict[str, str]:
    """Secrets of the embedded default, created once with mode 0600 beside the database."""
    path = data_dir / "secrets.json"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        values = {"signing_key": secrets.token_urlsafe(48), "master_key": secrets.token_urlsafe(48)}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(values, fh)
        try:
            # link() fails if another process won the race; then its secrets are the ones.
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return dict(json.loads(path.read_text()))


@lru_cache
def get_settings() -> Settings:
    return Settings()
