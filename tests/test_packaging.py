"""What a non-editable install gets (the Dockerfile's `pip install .`, a node's `pip install
tensor-registry`): the wheel carries the files that are not Python — the device digest kernels'
CUDA C source (without it a node's verified loads silently hash on host threads), the web UI,
Alembic's template — and the vLLM plugin's entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.serve_process import ROOT

PACKAGED = {"pyproject.toml", "README.md", "app", "workers", "migrations", "frontend"}


def test_the_wheel_carries_kernels_frontend_migrations_and_the_vllm_entry_point(
    tmp_path: Path,
) -> None:
    # Built from a copy of the files git knows (not the checkout: its build/ folder would keep
    # a file that pyproject.toml no longer ships).
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    source = tmp_path / "source"
    for name in listed:
        top = name.split("/", 1)[0]
        if name and (ROOT / name).is_file() and top in PACKAGED:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("tensor_registry-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        kernel = archive.read("app/client/engine/blake3_kernels.cu")
        points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = archive.read(points).decode()
    assert kernel == (ROOT / "app/client/engine/blake3_kernels.cu").read_bytes()
    for name in (
        "app/client/engine/kernels.py",
        "frontend/index.html",
        "frontend/js/app.js",
        "migrations/script.py.mako",
    ):
        assert name in names, name
    assert "tensor_registry = app.client.vllm_loader:register" in entry_points
    assert "tensor-registry = app.client.cli:main" in entry_points
