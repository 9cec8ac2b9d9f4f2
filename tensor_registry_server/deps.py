"""Typed dependencies for process-wide objects created in the lifespan.

``async def`` on purpose: FastAPI runs a plain ``def`` dependency on its thread pool, two
thread hand-offs per request for an attribute read. Under load every hand-off waits for a
core: profiled, they were most of a signed blob request's route work, and on a busy 16-core
host the engine's readers waited ~12 ms per range request (bench/RESULTS.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tensor_registry_server.core.queue import TaskSender
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.registry import StorageRegistry


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _storages(request: Request) -> StorageRegistry:
    return request.app.state.storages


async def _sender(request: Request) -> TaskSender:
    return request.app.state.task_sender


SettingsDep = Annotated[Settings, Depends(_settings)]
StoragesDep = Annotated[StorageRegistry, Depends(_storages)]
SenderDep = Annotated[TaskSender, Depends(_sender)]
