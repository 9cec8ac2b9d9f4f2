"""Typed dependencies for process-wide objects created in the lifespan."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.core.queue import TaskSender
from app.settings import Settings
from app.storage.registry import StorageRegistry


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _storages(request: Request) -> StorageRegistry:
    return request.app.state.storages


def _sender(request: Request) -> TaskSender:
    return request.app.state.task_sender


SettingsDep = Annotated[Settings, Depends(_settings)]
StoragesDep = Annotated[StorageRegistry, Depends(_storages)]
SenderDep = Annotated[TaskSender, Depends(_sender)]
