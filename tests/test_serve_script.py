"""`./scripts/serve` as a new user meets it: the first start says what it is doing while it
builds the virtualenv (minutes, otherwise silent), and where the command it installed lives (a
new shell does not have that virtualenv on PATH). pip, venv and the server are stand-ins that
record what they were asked; the script itself runs as written."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from harness.serve_process import ROOT

PYTHON_STAND_IN = """#!/bin/sh
# `python3 -m venv DIR`: a venv whose python and tensor-registry are stand-ins too.
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  cp "$0" "$3/bin/python"
  printf '#!/bin/sh\\necho "tensor-registry $*"\\n' > "$3/bin/tensor-registry"
  chmod +x "$3/bin/tensor-registry"
fi
echo "python $*" >> "$STAND_IN_LOG"
"""


def _run(checkout: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(checkout / "scripts" / "serve"), "--port", "9000"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_first_start_says_what_it_installs_and_where_the_command_is(tmp_path: Path) -> None:
    checkout = tmp_path / "clone"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("serve", "_env.sh"):
        shutil.copy2(ROOT / "scripts" / name, checkout / "scripts" / name)
    for name in ("pyproject.toml", "constraints.txt", "client/pyproject.toml"):
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("")
    stand_in = tmp_path / "python3"
    stand_in.write_text(PYTHON_STAND_IN)
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHON": str(stand_in),
        "STAND_IN_LOG": str(tmp_path / "log"),
    }
    first = _run(checkout, env)
    assert first.returncode == 0, first.stderr
    venv = checkout / ".venv"
    assert f"creating the virtualenv {venv}" in first.stderr, first.stderr
    assert "installing the project and the CPU build of torch" in first.stderr, first.stderr
    assert f"run {venv}/bin/tensor-registry" in first.stderr, first.stderr
    assert f"source {venv}/bin/activate" in first.stderr, first.stderr
    assert first.stdout == "tensor-registry serve --port 9000\n"
    assert "torch==2.13.0" in (tmp_path / "log").read_text()

    later = _run(checkout, env)
    assert later.returncode == 0 and later.stderr == "", later.stderr
    assert later.stdout == "tensor-registry serve --port 9000\n"
