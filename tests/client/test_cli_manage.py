"""Management commands of `tensor-registry` as subprocesses against one real `serve`.

login/logout/whoami, models, versions, aliases (with the If-Match race), artifacts, jobs
(follow, Ctrl-C and re-attach, cancel), tokens, the node cache, completion, --version, the
light import of --help, `host:port` URLs and a reader that closes stdout early.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.artifacts import make_artifact
from harness.serve_process import ROOT
from tensor_registry.cli.output import format_size
from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
from tensor_registry_server.jobs import lifecycle, problems
from tensor_registry_server.rows.jobs import Job
from tests.client.conftest import Registry
from tests.client.lines import LineReader
from tests.client.test_cli import _pretend_a_cpu_worker_is_live, finish_job

HEAVY = ["fastapi", "starlette", "sqlalchemy", "celery", "torch", "uvicorn", "pydantic_settings"]


def _name() -> str:
    return f"acme/m-{uuid.uuid4().hex[:10]}"


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result


def _rows(stdout: str) -> list[list[str]]:
    """A printed table as cells (header row first); cells hold no double spaces."""
    return [[c for c in line.split("  ") if c] for line in stdout.splitlines() if line.strip()]


def _cells(stdout: str) -> list[list[str]]:
    return [[c.strip() for c in row] for row in _rows(stdout)]


# ---------------------------------------------------------------------------------------------
# start-up


def test_cli_imports_no_server_packages_and_help_is_fast() -> None:
    script = (
        "import sys, tensor_registry.cli.main as cli; cli.build_parser();"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    probe = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert probe.returncode == 0, probe.stderr
    # With the server installed (as here) the server commands are listed, yet not imported.
    assert probe.stdout.strip() == "[]"
    # CPU seconds, not wall time: a loaded machine stretches the wall clock, not the work.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    helped = subprocess.run(
        [sys.executable, "-m", "tensor_registry.cli", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert helped.returncode == 0 and "serve" in helped.stdout and "whoami" in helped.stdout
    assert cpu < 1.0, f"--help took {cpu:.2f} CPU seconds"


def test_version_flag(registry: Registry) -> None:
    from tensor_registry_server import __version__

    result = _ok(registry.cli("--version"))
    assert result.stdout.strip() == f"tensor-registry {__version__}"


# ---------------------------------------------------------------------------------------------
# login / whoami / logout


def test_login_stores_the_token_0600_and_flags_and_env_win(
    registry: Registry, tmp_path: Path
) -> None:
    config_home = tmp_path / "xdg"
    bare = {
        "XDG_CONFIG_HOME": str(config_home),
        "TENSOR_REGISTRY_TOKEN": None,
        "TENSOR_REGISTRY_URL": None,
    }
    secret = registry.token_with("models:read", "resolve", name="alice-laptop")
    other = registry.token_with("models:read", name="ci-bot")
    hostport = registry.url.removeprefix("http://")

    refused = registry.cli("login", "--url", hostport, env=bare, input="trg_" + "q" * 43 + "\n")
    assert refused.returncode == 1 and "invalid_token" in refused.stderr
    assert not (config_home / "tensor-registry" / "config.json").exists()

    # The token comes on stdin (not argv); the URL is given as host:port without a scheme.
    login = _ok(registry.cli("login", "--url", hostport, env=bare, input=secret + "\n"))
    assert "as token 'alice-laptop'" in login.stderr
    stored = config_home / "tensor-registry" / "config.json"
    assert stored.stat().st_mode & 0o777 == 0o600
    assert stored.parent.stat().st_mode & 0o777 == 0o700
    assert json.loads(stored.read_text()) == {"url": registry.url, "token": secret}
    assert secret not in login.stdout + login.stderr

    me = _ok(registry.cli("whoami", "--json", env=bare))
    body = json.loads(me.stdout)
    assert body["name"] == "alice-laptop" and body["scopes"] == ["models:read", "resolve"]
    assert body["namespaces"] is None and body["expires_at"] is None
    assert body["url"] == registry.url and body["token_source"] == str(stored)
    human = _ok(registry.cli("whoami", env=bare)).stdout
    assert "alice-laptop" in human and "models:read, resolve" in human and "never" in human

    # --token and TENSOR_REGISTRY_TOKEN win over the stored token.
    flag = json.loads(_ok(registry.cli("whoami", "--json", "--token", other, env=bare)).stdout)
    assert flag["name"] == "ci-bot" and flag["token_source"] == "--token"
    via_env = json.loads(
        _ok(registry.cli("whoami", "--json", env={**bare, "TENSOR_REGISTRY_TOKEN": other})).stdout
    )
    assert via_env["name"] == "ci-bot" and via_env["token_source"] == "TENSOR_REGISTRY_TOKEN"

    # The trust and engine commands take the stored URL and token as well (they had flags of
    # their own that read only the environment).
    missing = registry.cli("load", "acme/does-not-exist", env=bare)
    assert missing.returncode == 1 and "model_not_found" in missing.stderr, missing.stderr
    pinned = _ok(registry.cli("trust", env=bare))
    assert f"of {registry.url} pinned" in pinned.stderr

    out = _ok(registry.cli("logout", env=bare))
    assert "removed the stored token" in out.stderr and not stored.exists()
    after = registry.cli("whoami", env={**bare, "TENSOR_REGISTRY_URL": registry.url})
    assert after.returncode == 1 and "tensor-registry login" in after.stderr


def test_whoami_shows_namespaces_and_expiry(registry: Registry) -> None:
    with registry.http() as http:
        made = http.post(
            "/api/v1/tokens",
            json={
                "name": "ns-bot",
                "scopes": ["resolve"],
                "namespaces": ["acme"],
                "ttl_seconds": 3600,
            },
        ).json()
    human = _ok(registry.cli("whoami", token=made["token"])).stdout
    fields = dict(line.split(":", 1) for line in human.splitlines())
    assert fields["namespaces"].strip() == "acme"
    assert fields["expires"].strip() == made["expires_at"].replace("T", " ")[:19]
    assert fields["url"].strip() == registry.url


# ---------------------------------------------------------------------------------------------
# models, versions


def test_models_create_ls_show_edit_rm(registry: Registry) -> None:
    name = _name()
    created = _ok(
        registry.cli("models", "create", name, "--description", "a test model", "--tag", "llm")
    )
    assert created.stdout.startswith(f"created {name} (")
    listed = json.loads(_ok(registry.cli("models", "ls", "--json", "--q", name)).stdout)
    assert [(m["name"], m["tags"], m["description"]) for m in listed] == [
        (name, ["llm"], "a test model")
    ]
    table = _cells(_ok(registry.cli("models", "ls", "--tag", "llm")).stdout)
    assert table[0] == ["NAME", "TAGS", "UPDATED", "DESCRIPTION"]
    assert [name, "llm"] == next(r for r in table if r[0] == name)[:2]

    edited = _ok(registry.cli("models", "edit", name, "--description", "better", "--tag", "x"))
    assert "updated" in edited.stdout
    shown = json.loads(_ok(registry.cli("models", "show", name, "--json")).stdout)
    assert shown["description"] == "better" and shown["tags"] == ["x"]
    assert shown["versions"] == [] and shown["aliases"] == []

    refused = registry.cli("models", "rm", name)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    _ok(registry.cli("models", "rm", name, "--yes"))
    with registry.http() as http:
        assert http.get("/api/v1/models", params={"name": name}).json()["items"] == []
    gone = registry.cli("models", "show", name)
    assert gone.returncode == 1 and "model_not_found" in gone.stderr


def test_versions_ls_and_show_with_files(registry: Registry) -> None:
    name = _name()
    registry.ready_model(name, versions=2)
    table = _cells(_ok(registry.cli("versions", "ls", name)).stdout)
    assert table[0] == ["VERSION", "STATUS", "FILES", "SIZE", "ALIASES", "CREATED"]
    assert [r[:3] for r in table[1:]] == [["2", "ready", "2"], ["1", "ready", "2"]]
    assert table[1][3].endswith((" B", " kB"))  # human sizes, not '1,234 B'

    with registry.http() as http:
        model = http.get("/api/v1/models", params={"name": name}).json()["items"][0]
        api_version = http.get(f"/api/v1/models/{model['id']}/versions/1").json()
    human = _ok(registry.cli("versions", "show", f"{name}:1")).stdout
    rows = {r[0]: r for r in _cells(human.split("\n\n", 1)[1])}
    for f in api_version["files"]:
        assert rows[f["path"]][2] == f["sha256"]
    latest = json.loads(_ok(registry.cli("versions", "show", name, "--json")).stdout)
    assert latest["version"] == 2 and {f["path"] for f in latest["files"]} == set(rows) - {"PATH"}


# ---------------------------------------------------------------------------------------------
# aliases


class _RacingProxy(http.server.ThreadingHTTPServer):
    """Forwards to the registry; before the first alias PUT it moves the alias itself, as a
    second writer would between the CLI's read and its write."""

    def __init__(self, registry: Registry, model_id: str, alias: str, to_version: int) -> None:
        self.registry, self.model_id, self.alias, self.to_version = (
            registry,
            model_id,
            alias,
            to_version,
        )
        self.raced = False
        self.if_match_seen: list[str | None] = []
        super().__init__(("127.0.0.1", 0), _Forward)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Forward(http.server.BaseHTTPRequestHandler):
    server: _RacingProxy

    def log_message(self, *_: object) -> None:
        pass

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        proxy = self.server
        if self.command == "PUT" and "/aliases/" in self.path:
            proxy.if_match_seen.append(self.headers.get("If-Match"))
            if not proxy.raced:
                proxy.raced = True
                with proxy.registry.http() as other_writer:
                    moved = other_writer.put(
                        f"/api/v1/models/{proxy.model_id}/aliases/{proxy.alias}",
                        json={"version": proxy.to_version},
                    )
                    assert moved.status_code == 200, moved.text
        skip = ("host", "content-length")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        answer = httpx.request(
            self.command, proxy.registry.url + self.path, headers=headers, content=body
        )
        self.send_response(answer.status_code)
        for key, value in answer.headers.items():
            if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_PUT = do_POST = do_DELETE = _forward


@pytest.fixture
def racing_proxy(registry: Registry) -> Iterator[Any]:
    servers: list[_RacingProxy] = []

    def start(model_id: str, alias: str, to_version: int) -> _RacingProxy:
        proxy = _RacingProxy(registry, model_id, alias, to_version)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        servers.append(proxy)
        return proxy

    yield start
    for proxy in servers:
        proxy.shutdown()
        proxy.server_close()


def test_alias_set_ls_history_rm(registry: Registry, racing_proxy: Any) -> None:
    name = _name()
    model = registry.ready_model(name, versions=3)
    first = _ok(registry.cli("alias", "set", name, "prod", "1"))
    assert first.stdout.strip() == f"{name}:prod -> version 1 (was new)"
    moved = _ok(registry.cli("alias", "set", name, "prod", "2"))
    assert moved.stdout.strip() == f"{name}:prod -> version 2 (was version 1)"
    same = _ok(registry.cli("alias", "set", name, "prod", "2"))
    assert "already points at version 2" in same.stdout

    # Another writer moves prod to 3 between this command's read and its write: the stale
    # If-Match gets 412, the command reads again and retries with the fresh ETag.
    proxy = racing_proxy(str(model["id"]), "prod", 3)
    raced = _ok(registry.cli("alias", "set", name, "prod", "1", "--url", proxy.url))
    assert "moved by someone else" in raced.stderr
    assert raced.stdout.strip() == f"{name}:prod -> version 1 (was version 3)"
    assert len(proxy.if_match_seen) == 2 and proxy.if_match_seen[0] != proxy.if_match_seen[1]
    assert all(proxy.if_match_seen)

    # --expect refuses instead when the alias is not where the caller believes it is.
    refused = registry.cli("alias", "set", name, "prod", "2", "--expect", "3")
    assert refused.returncode == 1 and "alias_moved" in refused.stderr
    _ok(registry.cli("alias", "set", name, "staging", "3", "--expect", "0"))

    listed = json.loads(_ok(registry.cli("alias", "ls", name, "--json")).stdout)
    assert {a["alias"]: a["version"] for a in listed} == {"prod": 1, "staging": 3}
    table = _cells(_ok(registry.cli("alias", "ls", name)).stdout)
    assert [r[:2] for r in table] == [["ALIAS", "VERSION"], ["prod", "1"], ["staging", "3"]]

    history = json.loads(_ok(registry.cli("alias", "history", name, "prod", "--json")).stdout)
    assert [(e["from_version"], e["to_version"]) for e in history] == [
        (3, 1),
        (2, 3),
        (1, 2),
        (None, 1),
    ]
    _ok(registry.cli("alias", "rm", name, "staging"))
    with registry.http() as http:
        gone = http.get(f"/api/v1/models/{model['id']}/aliases/staging")
    assert gone.status_code == 404


# ---------------------------------------------------------------------------------------------
# artifacts


async def test_artifacts_ls_and_rm(registry: Registry) -> None:
    name = _name()
    registry.ready_model(name, versions=2)
    plain = await make_artifact(registry.settings, model=name, version=1, dtype="bfloat16")
    secret = await make_artifact(registry.settings, model=name, version=2, encrypted=True)
    rows = _cells(_ok(registry.cli("artifacts", "ls", name)).stdout)
    assert rows[0] == ["ID", "VERSION", "VARIANT", "STATUS", "SIZE", "CREATED"]
    by_id = {r[0]: r for r in rows[1:]}
    assert by_id[str(plain.id)][1:4] == ["1", "bfloat16/hf/tp1", "ready"]
    assert by_id[str(secret.id)][1:4] == ["2", "float32/hf/tp1/encrypted", "ready"]
    only_v2 = json.loads(_ok(registry.cli("artifacts", "ls", f"{name}:2", "--json")).stdout)
    assert [a["id"] for a in only_v2] == [str(secret.id)]

    _ok(registry.cli("artifacts", "rm", str(plain.id), "--yes"))
    with registry.http() as http:
        assert http.get(f"/api/v1/artifacts/{plain.id}").status_code == 404


# ---------------------------------------------------------------------------------------------
# jobs


def _cli_process(registry: Registry, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tensor_registry.cli", *args],
        cwd=ROOT,
        env=registry.cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_ctrl_c_leaves_the_job_and_jobs_follow_reattaches(registry: Registry) -> None:
    name = _name()
    model = registry.ready_model(name)
    await _pretend_a_cpu_worker_is_live(registry)
    waiting = _cli_process(
        registry, "tensorize", name, "--dtype", "bfloat16", "--format", "hf", "--wait"
    )
    try:
        err_lines = LineReader(waiting.stderr)
        err_lines.wait_for("following job")
        waiting.send_signal(signal.SIGINT)
        waiting.wait(timeout=30)
        err = err_lines.text()
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 130, err
    with registry.http() as http:
        jobs = http.get("/api/v1/jobs", params={"model_id": model["id"]}).json()["items"]
    assert len(jobs) == 1 and jobs[0]["status"] == "queued"  # still there, still queued
    job_id = jobs[0]["id"]
    assert f"tensor-registry jobs follow {job_id}" in err
    assert f"tensor-registry jobs cancel {job_id}" in err

    # The printed command re-attaches; the job finishing ends it with the artifact id.
    follow = _cli_process(registry, "jobs", "follow", job_id)
    try:
        err_lines = LineReader(follow.stderr)
        err_lines.wait_for("following job")
        await finish_job(registry, job_id)
        follow.wait(timeout=60)
        assert follow.stdout is not None
        out, err = follow.stdout.read(), err_lines.text()
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 0, err
    with registry.http() as http:
        artifact_id = http.get(f"/api/v1/jobs/{job_id}").json()["artifact_id"]
    assert out.strip() == artifact_id

    listed = json.loads(_ok(registry.cli("jobs", "ls", "--model", name, "--json")).stdout)
    assert [(j["id"], j["status"]) for j in listed] == [(job_id, "succeeded")]
    shown = _ok(registry.cli("jobs", "show", job_id)).stdout
    assert "succeeded" in shown and artifact_id in shown


async def test_jobs_cancel(registry: Registry) -> None:
    name = _name()
    registry.ready_model(name)
    await _pretend_a_cpu_worker_is_live(registry)
    queued = _ok(registry.cli("tensorize", name, "--dtype", "float16", "--format", "hf", "--json"))
    job = json.loads(queued.stdout)
    assert job["kind"] == "tensorize" and job["status"] == "queued"
    job_id = job["id"]
    table = _cells(_ok(registry.cli("jobs", "ls", "--model", name)).stdout)
    assert table[0] == ["ID", "KIND", "STATUS", "MAKES", "STORAGE", "PROGRESS", "CREATED"]
    # What the job makes, from its artifact row: the version, the variant and the storage.
    assert table[1][:5] == [job_id, "tensorize", "queued", "v1 float16/hf/tp1", "local"]
    shown = _ok(registry.cli("jobs", "show", job_id)).stdout
    assert "makes:    v1 float16/hf/tp1" in shown and "storage:  local" in shown
    cancelled = _ok(registry.cli("jobs", "cancel", job_id, "--json"))
    assert json.loads(cancelled.stdout)["id"] == job_id
    with registry.http() as http:
        job = http.get(f"/api/v1/jobs/{job_id}").json()
    assert job["status"] == "cancelled"  # it was still queued: cancelled at once
    # Its artifact row is removed with the cancel, and with it what the job would have made
    # (the variant has one home, the artifact row; the job keeps no copy).
    table = _cells(_ok(registry.cli("jobs", "ls", "--model", name)).stdout)
    assert table[1][:5] == [job_id, "tensorize", "cancelled", "-", "-"]
    again = _ok(registry.cli("jobs", "cancel", job_id))  # idempotent
    assert again.stdout.strip() == f"job {job_id} cancelled"
    # The cancelled job's pending artifact is gone, not listed as `failed 0 B`.
    listed = _cells(_ok(registry.cli("artifacts", "ls", name)).stdout)
    assert listed == [["ID", "VERSION", "VARIANT", "STATUS", "SIZE", "CREATED"]]
    with registry.http() as http:
        assert http.get(f"/api/v1/artifacts/{job['artifact_id']}").status_code == 404
    # The variant can be asked for again.
    _ok(registry.cli("tensorize", name, "--dtype", "float16", "--format", "hf", "--json"))


async def _play_a_worker_that_stops_on_cancel(registry: Registry, job_id: str) -> None:
    """Run the job on a pretend worker; when a cancel is asked, end it as a worker does."""
    engine = create_engine(registry.settings.database_url)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            job = await session.get(Job, uuid.UUID(job_id))
            assert job is not None
            job.status, job.worker, job.stage = "running", "client-tests-fake-worker/1", "load"
        for _ in range(600):
            async with session_scope(make_sessionmaker(engine)) as session:
                job = await session.get(Job, uuid.UUID(job_id), populate_existing=True)
                assert job is not None
                if job.cancel_requested:
                    await lifecycle.finish_job(
                        session,
                        job,
                        worker=job.worker,
                        status="cancelled",
                        error=problems.problem("cancelled", "The job was cancelled.", status=409),
                    )
                    return
            await asyncio.sleep(0.1)
        raise AssertionError("no cancel arrived")
    finally:
        await engine.dispose()


async def test_jobs_cancel_of_a_running_job_waits_and_prints_cancelled(
    registry: Registry,
) -> None:
    name = _name()
    registry.ready_model(name)
    await _pretend_a_cpu_worker_is_live(registry)
    queued = _ok(registry.cli("tensorize", name, "--dtype", "bfloat16", "--format", "hf"))
    job_id = queued.stdout.strip()
    worker = asyncio.create_task(_play_a_worker_that_stops_on_cancel(registry, job_id))
    cancel = await asyncio.to_thread(registry.cli, "jobs", "cancel", job_id)
    await worker
    assert _ok(cancel).stdout.strip() == f"job {job_id} cancelled"
    assert "waiting for its worker to stop it" in cancel.stderr
    listed = _cells(_ok(registry.cli("artifacts", "ls", name)).stdout)
    assert len(listed) == 1, listed  # the header only

    # --no-wait says the job is stopping, not that it is running.
    other = _ok(registry.cli("tensorize", name, "--dtype", "float32", "--format", "hf")).stdout
    job_id = other.strip()
    engine = create_engine(registry.settings.database_url)
    async with session_scope(make_sessionmaker(engine)) as session:
        row = await session.get(Job, uuid.UUID(job_id))
        assert row is not None
        row.status, row.worker = "running", "client-tests-fake-worker/1"
    await engine.dispose()
    now = _ok(registry.cli("jobs", "cancel", job_id, "--no-wait"))
    assert now.stdout.strip() == f"job {job_id} cancelling"
    assert f"tensor-registry jobs follow {job_id}" in now.stderr
    row_status = _cells(_ok(registry.cli("jobs", "ls", "--model", name)).stdout)[1][2]
    assert row_status == "cancelling"


# ---------------------------------------------------------------------------------------------
# tokens


def test_tokens_create_ls_revoke(registry: Registry) -> None:
    created = _ok(
        registry.cli(
            "tokens",
            "create",
            "--name",
            "node-7",
            "--scope",
            "resolve",
            "--scope",
            "keys:read",
            "--namespace",
            "acme",
            "--ttl",
            "3600",
        )
    )
    secret = created.stdout.strip()
    assert secret.startswith("trg_") and "shown only now" in created.stderr
    assert secret not in created.stderr
    me = json.loads(_ok(registry.cli("whoami", "--json", token=secret)).stdout)
    assert me["name"] == "node-7" and me["scopes"] == ["keys:read", "resolve"]
    assert me["namespaces"] == ["acme"] and me["expires_at"]

    listed = json.loads(_ok(registry.cli("tokens", "ls", "--json")).stdout)
    mine = next(t for t in listed if t["id"] == me["id"])
    assert "token" not in mine and mine["revoked_at"] is None
    table = _cells(_ok(registry.cli("tokens", "ls")).stdout)
    assert next(r for r in table if r[0] == me["id"])[1:5] == [
        "node-7",
        mine["prefix"],
        "keys:read,resolve",
        "acme",
    ]

    _ok(registry.cli("tokens", "revoke", me["id"]))
    refused = registry.cli("whoami", token=secret)
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr


# ---------------------------------------------------------------------------------------------
# node cache


async def test_cache_ls_prune_rm(registry: Registry, tmp_path: Path, cache_dir: Path) -> None:
    name = _name()
    registry.ready_model(name)
    made = await make_artifact(registry.settings, model=name, version=1)
    _ok(
        registry.cli(
            "pull", name, "--dest", str(tmp_path / "a"), "--weights", "--cache-dir", str(cache_dir)
        )
    )
    where = ["--cache-dir", str(cache_dir)]
    listing = json.loads(_ok(registry.cli("cache", "ls", "--json", *where)).stdout)
    digests = {o["sha256"]: o["size"] for o in listing["objects"]}
    expected = {hashlib.sha256(b).hexdigest(): len(b) for b in made.files.values()}
    assert digests == expected
    # Each object is also placed (hard-linked) in the pull's destination.
    assert {o["links"] for o in listing["objects"]} == {1}
    table = _cells(_ok(registry.cli("cache", "ls", *where)).stdout)
    assert table[0] == ["SHA256", "SIZE", "LAST USED", "LINKS"] and len(table) == 1 + len(digests)

    # A second pull (without weights) reuses config and tokenizer: they become the most
    # recently used objects, so pruning down to their size removes only the weights.
    weights = hashlib.sha256(made.files["model.tensors"]).hexdigest()
    hour_ago = time.time() - 3600
    # Last use is the verified stamp's mtime (touching an object would move its ctime).
    for entry in cache_dir.glob("verified/*/*"):
        os.utime(entry, (hour_ago, hour_ago))
    _ok(registry.cli("pull", name, "--dest", str(tmp_path / "b"), "--cache-dir", str(cache_dir)))
    keep = sum(size for digest, size in digests.items() if digest != weights)
    pruned = _ok(registry.cli("cache", "prune", "--max-size", f"{keep}B", *where))
    assert [line.split()[1] for line in pruned.stdout.splitlines()] == [weights]
    assert {p.name for p in cache_dir.glob("objects/sha256/*/*")} == set(digests) - {weights}
    # Files placed before stay intact: pruning the cache never breaks a destination.
    assert (tmp_path / "a" / "model.tensors").read_bytes() == made.files["model.tensors"]

    left = sorted(set(digests) - {weights})
    removed = _ok(registry.cli("cache", "rm", *(d[:12] for d in left), *where))
    assert [line.split()[1] for line in removed.stdout.splitlines()] == left
    assert list(cache_dir.glob("objects/sha256/*/*")) == []
    missing = registry.cli("cache", "rm", "0123456789ab", *where)
    assert missing.returncode == 1 and "no cached object" in missing.stderr
    bad = registry.cli("cache", "prune", "--max-size", "lots", *where)
    assert bad.returncode == 2 and "is not a size" in bad.stderr


# ---------------------------------------------------------------------------------------------
# completion, pipes, human output


def test_bash_completion_offers_commands_subcommands_and_choices(registry: Registry) -> None:
    script = _ok(registry.cli("completion", "bash")).stdout
    probe = (
        "source /dev/stdin\n"
        't() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _tensor_registry;'
        ' echo "${COMPREPLY[*]}"; }\n'
        "t tensor-registry al\nt tensor-registry alias ''\nt tensor-registry pull x --dtype ''\n"
        "t tensor-registry pull x --tensor-p\nt tensor-registry cache p\n"
    )
    loaded = probe.replace("source /dev/stdin", f"source <(cat <<'EOS'\n{script}\nEOS\n)")
    result = subprocess.run(
        ["bash", "-c", loaded],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "alias",
        "history ls rm set --help -h",
        "float16 bfloat16 float32",
        "--tensor-parallel-size",
        "prune",
    ]
    zsh = _ok(registry.cli("completion", "zsh")).stdout
    assert "bashcompinit" in zsh and "complete -F _tensor_registry tensor-registry" in zsh


async def test_a_reader_that_leaves_early_gets_no_broken_pipe_error(registry: Registry) -> None:
    name = _name()
    registry.ready_model(name)
    await make_artifact(registry.settings, model=name, version=1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensor_registry.cli", "resolve", name],
        cwd=ROOT,
        env=registry.cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `| head` does once it has enough
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert err == ""
    assert proc.returncode == 141


async def test_resolve_prints_human_sizes(registry: Registry) -> None:
    name = _name()
    registry.ready_model(name)
    made = await make_artifact(registry.settings, model=name, version=1)
    out = _ok(registry.cli("resolve", name)).stdout
    line = next(
        x
        for x in out.splitlines()
        if "model.tensors" in x and "sha" not in x[:5] and x.startswith("  ")
    )
    size = len(made.files["model.tensors"])
    assert format_size(size) in line and format_size(size).endswith(" kB") and "," not in line


def test_the_readme_commands_use_flags_the_cli_accepts() -> None:
    """Every `tensor-registry` line of the README's "Using it" block parses (the commands
    themselves run in the tests above, against a real serve)."""
    import shlex

    from tensor_registry.cli.main import build_parser

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Using it", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    commands = [
        shlex.split(line, comments=True)
        for line in block.splitlines()
        if line.startswith("tensor-registry ")
    ]
    assert len(commands) >= 15
    seen = set()
    for words in commands:
        args = build_parser().parse_args(words[1:])
        assert callable(args.func), words
        seen.add(words[1])
    assert {"login", "publish", "tensorize", "alias", "resolve", "pull", "cache", "models"} <= seen
