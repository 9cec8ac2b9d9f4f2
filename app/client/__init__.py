"""The light serving-node client and the `tensor-registry` command line.

Importable with the base install (httpx): nothing here imports FastAPI, SQLAlchemy or Celery,
and tensorizer/torch are imported only when weights are loaded (``pip install
tensor-registry[client]``).

    from app.client import resolve, load_state_dict, load_into_module
    answer = resolve("acme/llama:prod", dtype="bfloat16")
    state = load_state_dict("acme/llama:prod")
"""

from app.client.api import RegistryClient, RegistryError, Resolution
from app.client.cache import NodeCache
from app.client.loading import load_into_module, load_state_dict, resolve

__all__ = [
    "NodeCache",
    "RegistryClient",
    "RegistryError",
    "Resolution",
    "load_into_module",
    "load_state_dict",
    "resolve",
]
