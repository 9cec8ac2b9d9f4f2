"""The light serving-node client and the `tensor-registry` command line.

Importable with the base install (httpx): nothing here imports FastAPI, SQLAlchemy or Celery.
"""
