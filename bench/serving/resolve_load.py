"""Resolve under load: GET /api/v1/resolve against GET /healthz on the same server, same run.

A real `tensor-registry serve` (no worker) on PostgreSQL + Redis — scaled mode, so the resolve
cache is on — with one model whose alias `prod` points at a ready artifact. wrk drives 64
connections at /healthz and at /api/v1/resolve?model=…&ref=prod, alternating, best of
``--rounds``; the ratio resolve/healthz is the figure (target >= 0.5x), with p50/p99 latency and
errors (target: no non-2xx, no socket errors). Afterwards every resolve must have its audit row.

    .venv/bin/python bench/serving/resolve_load.py [--seconds 10] [--connections 64] [--rounds 2]

Needs wrk (apt-get install wrk), PostgreSQL on 127.0.0.1:5432 (BENCH_POSTGRES_URL, a fresh
database is created and dropped) and Redis (BENCH_REDIS_URL).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import postgres_sql  # noqa: E402
from bench.engine.load import ADMIN_TOKEN, ready_version, register_artifact, registry  # noqa: E402

POSTGRES_URL = os.environ.get(
    "BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
MODEL = "bench/resolve"


async def _admin_sql(sql: str) -> None:
    await postgres_sql(POSTGRES_URL, sql)


async def _count_audit(database_url: str, action: str) -> int:
    from sqlalchemy import func, select

    from tensor_registry_server.core.db import create_engine
    from tensor_registry_server.rows.audit import AuditEvent

    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            return int(
                await conn.scalar(select(func.count()).where(AuditEvent.action == action)) or 0
            )
    finally:
        await engine.dispose()


def _ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def parse_wrk(output: str) -> dict[str, float]:
    """Requests/sec, completed requests, p50/p99 (ms), non-2xx and socket errors."""
    found = {
        "rps": re.search(r"Requests/sec:\s+([\d.]+)", output),
        "requests": re.search(r"(\d+) requests in", output),
        "p50": re.search(r"^\s+50%\s+(\S+)", output, re.MULTILINE),
        "p99": re.search(r"^\s+99%\s+(\S+)", output, re.MULTILINE),
    }
    if not all(found.values()):
        raise RuntimeError(f"unexpected wrk output:\n{output}")
    errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return {
        "rps": float(found["rps"].group(1)),  # type: ignore[union-attr]
        "requests": float(found["requests"].group(1)),  # type: ignore[union-attr]
        "p50_ms": _ms(found["p50"].group(1)),  # type: ignore[union-attr]
        "p99_ms": _ms(found["p99"].group(1)),  # type: ignore[union-attr]
        "non_2xx": float(non2xx.group(1)) if non2xx else 0.0,
        "socket_errors": float(sum(int(g) for g in errors.groups())) if errors else 0.0,
    }


def wrk(url: str, *, seconds: int, connections: int, threads: int, auth: bool) -> dict[str, float]:
    args = ["wrk", "--latency", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s"]
    if auth:
        args += ["-H", f"Authorization: Bearer {ADMIN_TOKEN}"]
    done = subprocess.run([*args, url], check=True, capture_output=True, text=True)
    return parse_wrk(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2

    database = f"tr_bench_{uuid.uuid4().hex[:10]}"
    database_url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{database}"
    asyncio.run(_admin_sql(f'CREATE DATABASE "{database}"'))
    work = Path(tempfile.mkdtemp(prefix="bench-resolve-"))
    try:
        env = {
            "TENSOR_REGISTRY_DATABASE__URL": database_url,
            "TENSOR_REGISTRY_BROKER__REDIS_URL": REDIS_URL,
        }
        with registry(work / "data", **env) as reg:
            model = ready_version(reg, MODEL)
            files = {}
            for name, data in (
                ("model.tensors", os.urandom(1 << 20)),
                ("config.json", b"{}"),
                ("tokenizer.json", b"{}"),
                ("tokenizer_config.json", b"{}"),
            ):
                (work / name).write_bytes(data)
                files[name] = work / name
            register_artifact(reg, MODEL, 1, files)
            import httpx

            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            httpx.put(
                f"{reg.url}/api/v1/models/{model['id']}/aliases/prod",
                json={"version": 1},
                headers=headers,
            ).raise_for_status()
            resolve_url = f"{reg.url}/api/v1/resolve?model={MODEL}&ref=prod"
            check = httpx.get(resolve_url, headers=headers)
            check.raise_for_status()
            assert check.json()["version"] == 1

            common = {"connections": args.connections, "threads": args.threads}
            wrk(resolve_url, seconds=2, auth=True, **common)  # warm caches and pools
            wrk(f"{reg.url}/healthz", seconds=2, auth=False, **common)
            time.sleep(1)
            audited_before = asyncio.run(_count_audit(database_url, "resolve"))
            results: dict[str, list[dict[str, float]]] = {"healthz": [], "resolve": []}
            for _ in range(args.rounds):
                results["healthz"].append(
                    wrk(f"{reg.url}/healthz", seconds=args.seconds, auth=False, **common)
                )
                results["resolve"].append(
                    wrk(resolve_url, seconds=args.seconds, auth=True, **common)
                )
            time.sleep(1.5)  # the audit buffer writes a few times a second
            audited = asyncio.run(_count_audit(database_url, "resolve")) - audited_before

        print(
            f"{args.connections} connections, {args.threads} wrk threads, {args.seconds} s x "
            f"{args.rounds} rounds each, alternating; {os.cpu_count()} CPUs shared by wrk, the "
            "server, PostgreSQL and Redis"
        )
        columns = [("best req/s", 12), ("p50 ms", 10), ("p99 ms", 10)]
        columns += [("non-2xx", 10), ("sock err", 10)]
        print(f"{'route':<10}" + "".join(f"{name:>{width}}" for name, width in columns))
        best = {}
        for route, runs in results.items():
            top = max(runs, key=lambda r: r["rps"])
            best[route] = top
            non2xx = sum(r["non_2xx"] for r in runs)
            socket_errors = sum(r["socket_errors"] for r in runs)
            print(
                f"{route:<10}{top['rps']:>12.0f}{top['p50_ms']:>10.1f}{top['p99_ms']:>10.1f}"
                f"{non2xx:>10.0f}{socket_errors:>10.0f}"
            )
        ratio = best["resolve"]["rps"] / best["healthz"]["rps"]
        completed = sum(r["requests"] for r in results["resolve"])
        print(f"resolve / healthz throughput: {ratio:.2f}x (target >= 0.5x)")
        print(
            f"audit rows for the measured resolves: {audited} for {completed:.0f} completed "
            f"requests ({'every resolve audited' if audited >= completed else 'MISSING ROWS'})"
        )
        errors = sum(r["non_2xx"] + r["socket_errors"] for runs in results.values() for r in runs)
        return 0 if errors == 0 and audited >= completed else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
        asyncio.run(_admin_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


if __name__ == "__main__":
    sys.exit(main())
