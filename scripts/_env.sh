# Shared by scripts/serve and scripts/test: a project virtualenv with the pinned torch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TENSOR_REGISTRY_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

ensure_venv() {
  local extras="$1"
  if [ ! -x "$VENV/bin/python" ]; then
    echo "tensor-registry: creating the virtualenv $VENV" >&2
    "$PY" -m venv "$VENV"
  fi
  # Re-install only when pyproject/constraints changed since the last install.
  local stamp="$VENV/.installed-$extras"
  if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] || [ "$ROOT/client/pyproject.toml" -nt "$stamp" ] \
     || [ "$ROOT/constraints.txt" -nt "$stamp" ]; then
    # The first start is otherwise silent for minutes (pip --quiet, torch is a large wheel).
    echo "tensor-registry: installing the project and the CPU build of torch into $VENV" \
      "(first start or changed requirements: a few minutes; later starts skip this)" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -c "$ROOT/constraints.txt" torch==2.13.0
    # Two distributions from this checkout: the library (client/, import name tensor_registry)
    # and the server that depends on it (the root). One pip call, so the server's requirement
    # on the library is met by this checkout's copy.
    "$VENV/bin/python" -m pip install --quiet -c "$ROOT/constraints.txt" \
      -e "$ROOT/client[client]" -e "$ROOT[$extras]"
    touch "$stamp"
    echo "tensor-registry: installed. A new shell does not have it on PATH: run" \
      "$VENV/bin/tensor-registry, or first: source $VENV/bin/activate" >&2
  fi
}
