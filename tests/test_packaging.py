"""What a non-editable install gets. Two distributions come from this repository:

- `tensor-registry` (client/pyproject.toml): the library a serving node installs, one top-level
  import name (`tensor_registry`), the `tensor-registry` command and the vLLM plugin's entry
  point, with the device digest kernels' CUDA C source (without it a node's verified loads
  silently hash on host threads);
- `tensor-registry-server` (pyproject.toml, the Dockerfile's `pip install ./client .`): the API,
  workers, migrations (with Alembic's template) and the web UI, and the entry point through
  which `tensor-registry` offers the server's commands.

The client wheel is installed into a clean virtual environment (no server package, no torch)
and run there, beside a folder of the node's own named `app` that must never be imported."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

from harness.serve_process import ROOT

SERVER_TOPS = {"pyproject.toml", "README.md", "tensor_registry_server"}
CLIENT_TOPS = {"client", "tensor_registry"}
SERVER_NAMES = ("tensor_registry_server", "fastapi", "sqlalchemy", "celery")


def _runtime_closure(distribution: str) -> set[str]:
    """The distributions a base install of `distribution` needs (no extras), as installed here:
    linked into the clean venv, so the test needs no package index."""
    seen: set[str] = set()
    todo = [distribution]
    while todo:
        name = todo.pop()
        for spec in importlib.metadata.requires(name) or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if req.name.lower() not in seen:
                seen.add(req.name.lower())
                todo.append(req.name)
    return seen


def _top_level_dirs(distribution: str) -> set[Path]:
    files = importlib.metadata.files(distribution) or []
    tops = set()
    for file in files:
        first = file.parts[0]
        if len(file.parts) > 1 and not first.endswith((".dist-info", ".data")) and first != "..":
            tops.add(Path(file.locate()).parents[len(file.parts) - 2])
    return tops


def _source_copy(tmp_path: Path, tops: set[str]) -> Path:
    """The files git knows under `tops` (not the checkout: its build/ folder would keep a file
    that the project no longer ships)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    source = tmp_path / "source"
    for name in listed:
        top = name.split("/", 1)[0]
        if name and (ROOT / name).is_file() and top in tops:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    return source


def _wheel(tmp_path: Path, project: Path, pattern: str) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(project)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob(pattern)
    return wheel


def _entry_points(archive: zipfile.ZipFile) -> str:
    points = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
    return archive.read(points).decode()


def test_the_server_wheel_carries_frontend_migrations_and_the_server_commands(
    tmp_path: Path,
) -> None:
    source = _source_copy(tmp_path, SERVER_TOPS)
    wheel = _wheel(tmp_path, source, "tensor_registry_server-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = _entry_points(archive)
        requires = archive.read(
            next(n for n in names if n.endswith(".dist-info/METADATA"))
        ).decode()
    for name in (
        "tensor_registry_server/ui/index.html",
        "tensor_registry_server/ui/js/app.js",
        "tensor_registry_server/migrations/script.py.mako",
    ):
        assert name in names, name
    assert not any(n.startswith("tensor_registry/") for n in names), "the library is its own"
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"tensor_registry_server"}, "installing the server adds one import name"
    assert "server = tensor_registry_server.server_cli:register" in entry_points
    assert "Requires-Dist: tensor-registry[client]" in requires


def test_the_client_wheel_installs_one_import_name_and_runs_without_the_server(
    tmp_path: Path,
) -> None:
    source = _source_copy(tmp_path, CLIENT_TOPS)
    wheel = _wheel(tmp_path, source / "client", "tensor_registry-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        kernel = archive.read("tensor_registry/engine/blake3_kernels.cu")
        entry_points = _entry_points(archive)
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"tensor_registry"}
    assert kernel == (ROOT / "tensor_registry/engine/blake3_kernels.cu").read_bytes()
    assert "tensor_registry = tensor_registry.vllm.plugin:register" in entry_points
    assert "tensor-registry = tensor_registry.cli.main:main" in entry_points

    # A clean venv: the wheel installed by pip, its run-time dependencies linked from here.
    env_dir = tmp_path / "node-venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    added = {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")}
    assert added - {"__pycache__"} == {"tensor_registry"}, added
    for dist in _runtime_closure("tensor-registry"):
        for here in _top_level_dirs(dist):
            if not (site / here.name).exists():
                (site / here.name).symlink_to(here, target_is_directory=True)

    # The node's own code has an `app` (and a `workers`) package: never imported by ours.
    node = tmp_path / "node"
    for own in ("app", "workers"):
        (node / own).mkdir(parents=True)
        (node / own / "__init__.py").write_text(f"raise SystemExit('{own} of the node imported')\n")
    script = textwrap.dedent(
        f"""
        import importlib, pkgutil, sys
        import tensor_registry
        from importlib.metadata import entry_points
        EXTRA = {{"tensorizer", "torch", "blake3", "cryptography", "numpy"}}
        # The plugin imports vllm, which this node lacks; __main__ runs the command.
        skip = ("tensor_registry.vllm.plugin", "tensor_registry.cli.__main__")
        for info in pkgutil.walk_packages(tensor_registry.__path__, "tensor_registry."):
            if info.name.startswith(skip):
                continue
            try:
                importlib.import_module(info.name)
            except ModuleNotFoundError as missing:
                # Only what the [client] extra adds may be missing from a base install.
                assert missing.name.split(".")[0] in EXTRA, (info.name, missing.name)
        (plugin,) = entry_points(group="vllm.general_plugins", name="tensor_registry")
        assert plugin.value == "tensor_registry.vllm.plugin:register", plugin.value
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in {SERVER_NAMES!r})
        assert not leaked, leaked
        print("ok")
        """
    )
    ran = subprocess.run(
        [str(python), "-c", script], cwd=node, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip() == "ok"

    command = env_dir / "bin" / "tensor-registry"
    helped = subprocess.run(
        [str(command), "--help"], cwd=node, capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0, helped.stderr[-3000:]
    # argparse lists each command at four spaces, its help wrapped further in.
    commands = {
        line.split()[0]
        for line in helped.stdout.splitlines()
        if line.startswith("    ") and not line.startswith("     ")
    }
    assert {"publish", "pull", "load", "verify", "vllm-args"} <= commands, commands
    assert not commands & {"serve", "worker", "migrate", "admin-token"}, commands


def _closure_with_extra(distribution: str, extra: str) -> set[str]:
    """`distribution[extra]`'s run-time distributions, as installed here."""
    seen: set[str] = set()
    for spec in importlib.metadata.requires(distribution) or []:
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            seen.add(req.name.lower())
    for name in list(seen):
        seen |= _runtime_closure(name)
    return seen


def _link_installed(site: Path, distributions: set[str]) -> None:
    """Each distribution's files and its dist-info, linked from here: pip in the clean venv sees
    them installed, so the README's command needs no package index."""
    for dist in distributions:
        for file in importlib.metadata.files(dist) or []:
            first = file.parts[0]
            if first in ("..", "__pycache__") or (site / first).exists():
                continue
            here = Path(file.locate()).parents[len(file.parts) - 2] if len(file.parts) > 1 else None
            (site / first).symlink_to(here if here else Path(file.locate()))


def test_the_readme_install_of_the_light_client_works_from_a_clone(tmp_path: Path) -> None:
    """README: `pip install './client[client]'` from a clone's root, as written (offline: no
    index, no isolated build; the dependencies already installed, as a node with torch has)."""
    readme = (ROOT / "README.md").read_text()
    command = "pip install './client[client]'"
    assert command in readme and "pip install 'tensor-registry[client]'" not in readme
    clone = _source_copy(tmp_path, CLIENT_TOPS)
    env_dir = tmp_path / "node-venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    # What an isolated build would fetch (setuptools) and what [client] pulls (torch included).
    _link_installed(site, _closure_with_extra("tensor-registry", "client") | {"setuptools"})
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
         "--no-build-isolation", "./client[client]"],
        cwd=clone, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert (site / "tensor_registry").is_dir() and not (site / "tensor_registry").is_symlink()
    ran = subprocess.run(
        [str(python), "-c", "import tensorizer, blake3, cryptography, tensor_registry.engine; "
         "print(tensor_registry.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.startswith(str(site)), ran.stdout
    helped = subprocess.run(
        [str(env_dir / "bin" / "tensor-registry"), "--version"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert helped.returncode == 0 and helped.stdout.strip(), helped.stderr
