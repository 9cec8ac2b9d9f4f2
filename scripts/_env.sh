# Shared by scripts/serve and scripts/test: a project virtualenv with the pinned torch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TENSOR_REGISTRY_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

ensure_venv() {
  local extras="$1"
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  # Re-install only when pyproject/constraints changed since the last install.
  local stamp="$VENV/.installed-$extras"
  if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] || [ "$ROOT/constraints.txt" -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -c "$ROOT/constraints.txt" torch==2.13.0
    "$VENV/bin/python" -m pip install --quiet -c "$ROOT/constraints.txt" -e "$ROOT[$extras]"
    touch "$stamp"
  fi
}
