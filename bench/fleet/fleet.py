"""A fleet rolling out a move of `prod`, on the scaled topology, started natively on loopback.

    .venv/bin/python bench/fleet/fleet.py --nodes 8 32 64 --size-mb 117 [--kill]

Started by the bench for each arm: a fresh PostgreSQL database, Redis (a key prefix of its own),
moto as the S3 server, `tensor-registry migrate`, two API replicas (`serve --no-worker`) behind
nginx as load balancer (deploy/nginx-lb.conf), nginx's cache tier (deploy/nginx-cache.conf) in
front of that, and N agents (`tensor-registry agent --watch bench/fleet:prod`) as separate
processes, each with its own node cache. Two artifacts are registered directly (S3 objects and
rows, no worker: the bench measures the rollout, not tensorize); `prod` starts on version 1,
every agent warms it, then `prod` moves to version 2 and the clock runs.

Arms, side by side for each N:
- ``cache``: the registry's public URL is the cache tier, so blob URLs go through it;
- ``direct``: the public URL is the load balancer (every node pulls from the origin).

Per arm: seconds from the move to the last agent told (its event arrived: push, not poll) and
to the last agent warm; bytes the origin sent for blobs ÷ the artifact's bytes (the live
replicas' ``tensor_registry_blob_bytes_served_total``, each replica's bytes since its own reading
at the move: with ``--kill`` the killed replica's counter is lost, so that figure is what the
survivor sent, never the survivor's minus the dead one's earlier bytes); resolve p50/p99 and
errors through the load balancer while the fleet pulls; with ``--kill``, one replica is killed
with SIGKILL once the first agent is told: agents that failed, and whether every agent logged
every event id exactly once. Ratios and counts only: absolute times on a 2-core VM say little.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    SIGNING_KEY,
    free_port,
    moto_server,
    postgres_sql,
    ready_versions,
    register_s3_artifact,
)
from harness import nginx  # noqa: E402
from harness.serve_process import ServeProcess, cpu_ticks  # noqa: E402

ADMIN_TOKEN = "trg_bench-fleet-admin-token-0123456789abcdefghijklm"
MASTER_KEY = "bench-fleet-master-key-0123456789abcdefghijklmnop"
POSTGRES_URL = os.environ.get(
    "BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
# Every replica signs with the same keys under the same identity (as a deployment sets them:
# each data dir would otherwise generate its own, and nodes would see two registries).
MANIFEST_SIGNING_KEY = "ZmxlZXQtYmVuY2gtbWFuaWZlc3Qta2V5LTAxMjM0NTY="  # 32 bytes, base64
REGISTRY_ID = "fleet-bench-registry"
MODEL = "bench/fleet"
BUCKET = "fleet-bench"


@dataclass
class Agent:
    index: int
    proc: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)

    def follow(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip()))

    def cpu_seconds(self) -> float:
        """User + system CPU this agent process has used so far."""
        return cpu_ticks(self.proc.pid) / os.sysconf("SC_CLK_TCK")

    def first(self, pattern: str, after: float) -> float | None:
        regex = re.compile(pattern)
        return next((t for t, line in list(self.lines) if t >= after and regex.search(line)), None)

    def event_ids(self) -> list[int]:
        found = (re.search(r"\bevent (\d+) ", line) for _, line in list(self.lines))
        return [int(m.group(1)) for m in found if m]


@dataclass
class Topology:
    lb: str
    cache: str
    replicas: list[ServeProcess]
    env: dict[str, str]
    work: Path

    def origin_blob_bytes(self) -> dict[int, float]:
        """Blob bytes each live replica has sent so far, by replica index (a killed replica's
        counter died with it: it is absent)."""
        import httpx

        sent: dict[int, float] = {}
        for index, replica in enumerate(self.replicas):
            if replica.proc is None or replica.proc.poll() is not None:
                continue
            text = httpx.get(f"{replica.url}/metrics", timeout=10).text
            sent[index] = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("tensor_registry_blob_bytes_served_total")
            )
        return sent


def _sent_since(before: dict[int, float], after: dict[int, float]) -> float:
    """Bytes the replicas alive at the end sent between the two readings: a killed replica's
    earlier bytes are never subtracted from the survivor's (issue 33 §6)."""
    return sum(total - before.get(index, 0.0) for index, total in after.items())


def _registry_env(database_url: str, s3_url: str, public_url: str, prefix: str) -> dict[str, str]:
    return {
        "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        "TENSOR_REGISTRY_LOG_LEVEL": "WARNING",
        "TENSOR_REGISTRY_PUBLIC_URL": public_url,
        "TENSOR_REGISTRY_DATABASE__URL": database_url,
        "TENSOR_REGISTRY_BROKER__URL": REDIS_URL,
        "TENSOR_REGISTRY_BROKER__REDIS_URL": REDIS_URL,
        "TENSOR_REGISTRY_BROKER__KEY_PREFIX": prefix,
        "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": SIGNING_KEY,
        "TENSOR_REGISTRY_SECURITY__MASTER_KEY": MASTER_KEY,
        "TENSOR_REGISTRY_SECURITY__MANIFEST_SIGNING_KEY": MANIFEST_SIGNING_KEY,
        "TENSOR_REGISTRY_SECURITY__MODEL_SIGNING_KEY": _model_signing_key(),
        "TENSOR_REGISTRY_SECURITY__REGISTRY_ID": REGISTRY_ID,
        "TENSOR_REGISTRY_STORAGE__DEFAULT_BACKEND": "s3",
        "TENSOR_REGISTRY_STORAGE__S3__ENDPOINT_URL": s3_url,
        "TENSOR_REGISTRY_STORAGE__S3__BUCKET": BUCKET,
        "TENSOR_REGISTRY_STORAGE__S3__ACCESS_KEY_ID": "testing",
        "TENSOR_REGISTRY_STORAGE__S3__SECRET_ACCESS_KEY": "testing",
        # The registry's own signed URLs, so the cache tier (or the LB) is the door.
        "TENSOR_REGISTRY_STORAGE__S3__PRESIGN_DOWNLOADS": "false",
    }


def _model_signing_key() -> str:
    """A P-256 private key (PEM) for model.sig, one per bench run."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _lb_conf(port: int, replicas: list[int]) -> str:
    """deploy/nginx-lb.conf with the replicas' loopback ports as an upstream group (compose
    names one service that Docker's DNS answers for; here two processes)."""
    text = (ROOT / "deploy" / "nginx-lb.conf").read_text()
    text = re.sub(r"^resolver .*$", "", text, flags=re.MULTILINE)
    # max_fails=0: no failure state kept across requests, as with the deploy file's
    # `proxy_pass $registry_api` (a name resolved per request); nginx still passes a request
    # that meets a dead replica on to the next one. With max_fails=1, one error of the survivor
    # in a --kill run's reconnect storm marked both replicas down: 502 for fail_timeout (5 s).
    servers = "".join(f"    server 127.0.0.1:{p} max_fails=0;\n" for p in replicas)
    upstream = f"upstream registry_replicas {{\n{servers}    keepalive 64;\n}}\n"
    assert "set $registry_api http://api:8000;" in text
    text = text.replace(
        "set $registry_api http://api:8000;", "set $registry_api http://registry_replicas;"
    )
    return upstream + text.replace("listen 8000;", f"listen 127.0.0.1:{port};")


def _cache_conf(port: int, origin: str, cache_dir: Path) -> str:
    text = (ROOT / "deploy" / "nginx-cache.conf").read_text()
    text = re.sub(r"^resolver .*$", "", text, flags=re.MULTILINE)
    text = text.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    text = text.replace("http://api:8000", origin)
    return text.replace("/var/cache/nginx/blobs", str(cache_dir))


@contextmanager
def topology(arm: str) -> Iterator[Topology]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-fleet-{arm}-"))
    database = f"tr_fleet_{uuid.uuid4().hex[:10]}"
    database_url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{database}"
    asyncio.run(postgres_sql(POSTGRES_URL, f'CREATE DATABASE "{database}"'))
    try:
        with ExitStack() as stack:
            s3_url = stack.enter_context(moto_server())
            import boto3

            boto3.client(
                "s3",
                endpoint_url=s3_url,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
                region_name="us-east-1",
            ).create_bucket(Bucket=BUCKET)
            lb_port, cache_port = free_port(), free_port()
            lb, cache = f"http://127.0.0.1:{lb_port}", f"http://127.0.0.1:{cache_port}"
            env = _registry_env(
                database_url, s3_url, cache if arm == "cache" else lb, f"fleet-{uuid.uuid4().hex}:"
            )
            subprocess.run(
                [sys.executable, "-m", "tensor_registry.cli", "migrate"],
                cwd=ROOT,
                env={**os.environ, **env, "TENSOR_REGISTRY_DATA_DIR": str(work / "migrate")},
                check=True,
                capture_output=True,
            )
            replicas = []
            for i in range(2):
                replica = ServeProcess(
                    data_dir=work / f"replica-{i}", port=free_port(), env=env, set_public_url=False
                )
                # A loaded 2-core VM can take minutes to start a replica: wait, don't fail.
                replicas.append(replica.start(timeout=600))
                stack.callback(replica.stop)
            stack.enter_context(
                nginx.running(_lb_conf(lb_port, [r.port for r in replicas]), lb_port)
            )
            (work / "cache").mkdir()
            stack.enter_context(
                nginx.running(_cache_conf(cache_port, lb, work / "cache"), cache_port)
            )
            yield Topology(lb, cache, replicas, env, work)
    finally:
        asyncio.run(
            postgres_sql(POSTGRES_URL, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        )
        shutil.rmtree(work, ignore_errors=True)


def _publish(top: Topology, size: int) -> dict[str, Any]:
    """Two versions of MODEL, each with a registered artifact of ``size`` bytes of weights
    (objects written to S3, rows inserted), and ``prod`` on version 1."""
    import httpx

    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    model = ready_versions(top.lb, ADMIN_TOKEN, MODEL, versions=2)
    for version in (1, 2):
        register_s3_artifact(top.env, MODEL, version, size, seed=version)
    httpx.put(
        f"{top.lb}/api/v1/models/{model['id']}/aliases/prod", json={"version": 1}, headers=headers
    ).raise_for_status()
    return model


def _artifact_bytes(top: Topology, deadline_s: float = 120) -> int:
    """The bytes of every file of what `prod` resolves to now (the artifact the fleet pulls).
    Retried until ``deadline_s``: one 503 or a replica that just died must not lose the run."""
    import httpx

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            answer = httpx.get(
                f"{top.lb}/api/v1/resolve",
                params={"model": MODEL, "ref": "prod"},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                timeout=30,
            )
            answer.raise_for_status()
            return sum(int(f["size"]) for f in answer.json()["files"])
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _start_agents(top: Topology, count: int) -> list[Agent]:
    agents = []
    for i in range(count):
        home = top.work / f"node-{i}"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")},
            "TENSOR_REGISTRY_URL": top.lb,
            "TENSOR_REGISTRY_TOKEN": ADMIN_TOKEN,
            "XDG_CONFIG_HOME": str(home / "config"),
            "PYTHONPATH": str(ROOT),
        }
        command = [sys.executable, "-m", "tensor_registry.cli", "agent", "--watch", f"{MODEL}:prod"]
        command += ["--cache-dir", str(home / "cache"), "--readers", "2"]
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        agent = Agent(i, proc)
        threading.Thread(target=agent.follow, daemon=True).start()
        agents.append(agent)
    return agents


def _wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


# The probe's pace: one resolve each PROBE_INTERVAL_S at most. Back to back, the probe was load
# itself: 895 resolves in one N = 64 rollout, each a replica's CPU on the same two cores.
PROBE_INTERVAL_S = 0.05


def _resolve_probe(
    top: Topology, stop: threading.Event, out: list[tuple[float, int, float]]
) -> None:
    """Resolves through the load balancer, one per PROBE_INTERVAL_S at most: (seconds taken,
    status, when)."""
    import httpx

    url = f"{top.lb}/api/v1/resolve?model={MODEL}&ref=prod"
    with httpx.Client(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as http:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                status = http.get(url).status_code
            except httpx.HTTPError:
                status = 0
            took = time.perf_counter() - started
            out.append((took, status, time.monotonic()))
            stop.wait(max(0.0, PROBE_INTERVAL_S - took))


def run_arm(arm: str, nodes: int, size: int, kill: bool, timeout: float) -> dict[str, Any]:
    import httpx

    with topology(arm) as top:
        model = _publish(top, size)
        agents = _start_agents(top, nodes)
        try:
            warm_v1 = r"warm on version 1\b"
            if not _wait(lambda: all(a.first(warm_v1, 0) for a in agents), timeout):
                return {"error": "not every agent warmed version 1", **_failures(top, agents)}
            before = top.origin_blob_bytes()
            cpu_before = sum(a.cpu_seconds() for a in agents)
            probes: list[tuple[float, int, float]] = []
            stop = threading.Event()
            probe = threading.Thread(target=_resolve_probe, args=(top, stop, probes))
            probe.start()
            moved = time.monotonic()
            httpx.put(
                f"{top.lb}/api/v1/models/{model['id']}/aliases/prod",
                json={"version": 2},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            ).raise_for_status()
            told = r"\bevent \d+ alias\.moved\b"
            killed = None
            if kill and _wait(lambda: any(a.first(told, moved) for a in agents), timeout):
                victim = top.replicas[1]
                assert victim.proc is not None
                victim.proc.send_signal(signal.SIGKILL)
                killed = time.monotonic() - moved
            _wait(lambda: all(a.first(r"warm on version 2\b", moved) for a in agents), timeout)
            stop.set()
            probe.join()
            agents_cpu = sum(a.cpu_seconds() for a in agents if a.proc.poll() is None) - cpu_before
            after = top.origin_blob_bytes()
            told_at = [a.first(told, moved) for a in agents]
            warm_at = [a.first(r"warm on version 2\b", moved) for a in agents]
            latencies = sorted(t for t, status, _ in probes if status == 200)
            failing = [at for _, status, at in probes if status != 200]
            ids = [a.event_ids() for a in agents]
            return {
                "nodes": nodes,
                "told_last_s": _last(told_at, moved),
                "warm_last_s": _last(warm_at, moved),
                "warm": sum(1 for t in warm_at if t),
                # The agents' own CPU from the move to the last warm, all agents together.
                "agents_cpu_s": agents_cpu,
                # Per the moved-to artifact's own bytes (every file of it), as stored.
                # Counted on the replicas alive at the end, each against its own reading at
                # the move; with --kill that is the survivor's bytes alone.
                "origin_per_artifact": _sent_since(before, after) / _artifact_bytes(top),
                "origin_replicas_counted": len(after),
                "resolve_p50_ms": _pct(latencies, 0.50) * 1000,
                "resolve_p99_ms": _pct(latencies, 0.99) * 1000,
                "resolve_errors": len(failing),
                # Answers by status (0: no answer), and from the first failing answer to the last.
                "resolve_statuses": dict(Counter(str(status) for _, status, _ in probes)),
                "resolve_errors_span_s": max(failing) - min(failing) if failing else 0.0,
                "resolves": len(probes),
                "killed_at_s": killed,
                "agents_exited": sum(1 for a in agents if a.proc.poll() not in (None,)),
                "events_exactly_once": all(len(i) == len(set(i)) for i in ids)
                and len({tuple(sorted(i)) for i in ids}) == 1,
                **_failures(top, agents),
            }
        finally:
            for agent in agents:
                agent.proc.send_signal(signal.SIGTERM)
            for agent in agents:
                try:
                    agent.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    agent.proc.kill()


def _failures(top: Topology, agents: list[Agent]) -> dict[str, Any]:
    """What went wrong along the way, for the row: the agents' failure lines (counted by text)
    and the first lines of each replica's tracebacks, so an error is read, not guessed."""
    failed = Counter(
        re.sub(r"\d+", "N", line)
        for agent in agents
        for _, line in list(agent.lines)
        if "failed (" in line or "down (" in line
    )
    tracebacks: list[str] = []
    for replica in top.replicas:
        lines = list(replica.lines)
        for i, line in enumerate(lines):
            if "Traceback" in line and len(tracebacks) < 5:
                tracebacks.append("\n".join(lines[i : i + 40]))
    return {"agent_failures": dict(failed.most_common(10)), "replica_tracebacks": tracebacks}


def _last(times: list[float | None], since: float) -> float | None:
    """Seconds from ``since`` to the last agent's moment; None when one never got there."""
    if not all(times):
        return None
    return max((t - since for t in times if t is not None), default=0.0)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--size-mb", type=float, default=117)
    parser.add_argument("--arms", nargs="+", default=["cache", "direct"])
    parser.add_argument("--kill", action="store_true", help="SIGKILL one replica mid-rollout")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    size = int(args.size_mb * 1_000_000)
    rows = []
    for nodes in args.nodes:
        for arm in args.arms:
            try:
                row = {"arm": arm, **run_arm(arm, nodes, size, args.kill, args.timeout)}
            except Exception as exc:  # one arm that cannot start loses no other row
                row = {"arm": arm, "nodes": nodes, "error": f"{type(exc).__name__}: {exc}"[:500]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:  # after every arm: a run cut short keeps what it measured
                args.out.write_text(json.dumps(rows, indent=1))
    columns: tuple[str, ...] = ("arm", "nodes", "told_last_s", "warm_last_s", "origin_per_artifact")
    columns += ("resolve_p50_ms", "resolve_p99_ms", "resolve_errors", "agents_exited")
    columns += ("events_exactly_once", "origin_replicas_counted")
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(_cell(row.get(c)) for c in columns))
    return 0


def _cell(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
