"""Typed dependencies for process-wide objects created in the lifespan."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.jobs.queue import TaskSender
from app.settings import Settings
from app.storage.registry import StorageRegistry


def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def _storages(request: Request) -> StorageRegistry:
    return request.app.state.storages  # type: ignore[no-any-return]


def _sender(request: Request) -> TaskSender:
    return request.app.state.task_sender  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(_settings)]
StoragesDep = Annotated[StorageRegistry, Depends(_storages)]
SenderDep = Annotated[TaskSender, Depends(_sender)]
