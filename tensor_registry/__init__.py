"""tensor_registry: the library a serving node installs (client, CLI, load engine, vLLM plugin,
node agent) and the wire formats the registry server shares with it.

Importable with the base install (httpx): nothing here imports FastAPI, SQLAlchemy or Celery,
and tensorizer/torch are imported only when weights are loaded (``pip install
tensor-registry[client]``).

    from tensor_registry import resolve, load_state_dict, load_into_module
    answer = resolve("acme/llama:prod", dtype="bfloat16")
    state = load_state_dict("acme/llama:prod")
"""

from tensor_registry.api.client import RegistryClient, RegistryError
from tensor_registry.api.resolution import Resolution
from tensor_registry.node_cache import NodeCache
from tensor_registry.tensorizer_load import load_into_module, load_state_dict, resolve
from tensor_registry.version import __version__

__all__ = [
    "NodeCache",
    "RegistryClient",
    "RegistryError",
    "Resolution",
    "__version__",
    "load_into_module",
    "load_state_dict",
    "resolve",
]
