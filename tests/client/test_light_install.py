"""The client installs and runs without the server's packages (or torch/tensorizer)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from harness.serve_process import ROOT

# A serving node with `pip install tensor-registry` has httpx and tqdm, nothing else of ours.
BLOCKED = [
    "fastapi",
    "starlette",
    "sqlalchemy",
    "alembic",
    "pydantic",
    "pydantic_settings",
    "celery",
    "kombu",
    "uvicorn",
    "redis",
    "aioboto3",
    "boto3",
    "torch",
    "triton",
    "tensorizer",
    "transformers",
]


def test_client_and_cli_import_and_run_without_server_packages() -> None:
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys
        BLOCKED = {BLOCKED!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is not installed on this node")
                return None

        sys.meta_path.insert(0, Block())
        import tensor_registry
        from tensor_registry import RegistryClient, load_state_dict, resolve, NodeCache
        from tensor_registry.cli.main import build_parser

        parser = build_parser()
        commands = set(parser._subparsers._group_actions[0].choices)
        assert {{"publish", "tensorize", "resolve", "pull", "vllm-args", "login", "whoami",
                 "models", "versions", "alias", "artifacts", "jobs", "tokens", "cache",
                 "completion"}} <= commands, commands
        assert {{"trust", "verify", "export", "import", "load-dir"}} <= commands, commands
        # Signed manifests verify on the node: cryptography is in the client extra.
        import base64, os
        from tensor_registry.formats.signed_manifest import verify, ManifestError
        from tensor_registry.trust import verify_directory, PinStore
        try:
            verify(b'{{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", '
                   b'"signatures": [{{"keyid": "ab", "sig": "AA=="}}]}}', {{}})
        except ManifestError as exc:
            assert exc.code == "untrusted_signing_key", exc.code
        assert "serve" not in commands, "server commands need the server packages"
        # The load engine imports torch only inside a load (and never Triton).
        from tensor_registry.engine import load_artifact, load_cuda, load_file_cpu, ChunkMismatch
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not leaked, leaked
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
