"""The agent's loop: follow events, re-resolve what moved, pre-pull it into the node cache.

    start ─▶ catch up: resolve every watch, pre-pull what is not warm
      │
      ▼
    follow GET /api/v1/events from the persisted Last-Event-ID ──▶ an event about a watched
      │  (blocking read: no CPU while idle)                        model: resolve that watch,
      │                                                             pre-pull if its artifact
      │ stream down (registry restarting, a proxy, an old server)   changed; then persist the
      ▼                                                             event id
    poll: resolve every watch, then wait 1 s, 2 s, 4 s … 60 s (with jitter) and try the stream
    again; a poll that finds a move pre-pulls it like an event would.

A pre-pull that failed (a 5xx, a dropped connection, a byte that did not match) is tried again
in the background, 1 s, 2 s, 4 s … 60 s apart (with jitter), until it succeeds or an event
makes it moot: one failure never leaves the node cold until the next move.

The event id is persisted after the event is handled (state.json, atomic replace), so a crash
or a registry restart replays from there: no move is missed, and one handled twice costs a
resolve (the cache already holds the bytes). Pre-pulls are verified against the artifact's
signed manifest (tensor_registry/trust/) and every file's sha256, take the node-wide lock of
their artifact (two agents, or an agent and `pull`, never download the same bytes twice), and
stay within ``max_cache_bytes``: least recently used objects are pruned first, never those of
an artifact a watch is warm on (what the node serves or is about to) nor objects placed
somewhere by hard link (a serving directory).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensor_registry import checkins
from tensor_registry.api.client import (
    ConnectionFailed,
    NotFound,
    RegistryClient,
    RegistryError,
)
from tensor_registry.api.resolution import Resolution
from tensor_registry.formats.events import ALIAS_EVENT_TYPES, WATCH_EVENT_TYPES
from tensor_registry.formats.paths import UnsafePath
from tensor_registry.node_cache import NodeCache
from tensor_registry.trust import verify_resolution
from tensor_registry.units import format_size

log = logging.getLogger("tensor_registry.agent")

STATE_FILE = "state.json"
# How long the retry thread sleeps when no retry is due (it is woken when one is scheduled).
RETRY_IDLE_SECONDS = 30.0


@dataclass(frozen=True)
class Watch:
    model: str
    ref: str
    filters: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.model}:{self.ref}"

    def concerns(self, event: dict[str, Any]) -> bool:
        data = event.get("data") or {}
        if data.get("model") != self.model:
            return False
        if event.get("type") in ALIAS_EVENT_TYPES:
            return bool(data.get("alias") == self.ref)
        return True


class AgentState:
    """What survives a restart: the last event handled and what each watch is warm on."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / STATE_FILE
        self.last_event_id: str | None = None
        self.warm: dict[str, dict[str, Any]] = {}
        try:
            saved = json.loads(self.path.read_text())
            self.last_event_id = saved.get("last_event_id")
            self.warm = dict(saved.get("warm") or {})
        except FileNotFoundError:
            pass
        except (OSError, ValueError):
            log.warning("agent: %s unreadable; starting afresh", self.path)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        staging.write_text(
            json.dumps({"last_event_id": self.last_event_id, "warm": self.warm}, indent=2) + "\n"
        )
        os.replace(staging, self.path)


class Agent:
    def __init__(
        self,
        client: RegistryClient,
        cache: NodeCache,
        watches: Sequence[Watch],
        *,
        state_dir: Path,
        max_cache_bytes: int | None = None,
        readers: int = 8,
        max_backoff: float = 60.0,
        idle_timeout: float = 60.0,
        stop: threading.Event | None = None,
        report: Callable[[str], None] | None = None,
        node_id: str | None = None,
        checkin_seconds: float = 60.0,
    ) -> None:
        self.client = client
        self.cache = cache
        self.watches = list(watches)
        self.state = AgentState(state_dir)
        self.max_cache_bytes = max_cache_bytes
        self.readers = readers
        self.max_backoff = max_backoff
        self.idle_timeout = idle_timeout
        self.stop = stop or threading.Event()
        self.report = report or (lambda line: log.info("%s", line))
        # One id per node, shared with load, pull and the vLLM plugin (tensor_registry/checkins).
        self.node_id = node_id or checkins.node_id(
            cache.root, legacy=self.state.path.with_name(checkins.NODE_ID_FILE)
        )
        self.checkin_seconds = checkin_seconds
        self._checkin_failed = False
        # One pre-pull at a time (the event stream's and the retries'); failed watches by label:
        # (failures in a row, when to try again, time.monotonic()).
        self._warming = threading.Lock()
        self._retries: dict[str, tuple[int, float]] = {}
        self._retry_changed = threading.Condition()

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        heartbeat = threading.Thread(target=self._heartbeat, name="agent-checkin", daemon=True)
        heartbeat.start()
        retry = threading.Thread(target=self._retry_failed, name="agent-retry", daemon=True)
        retry.start()
        try:
            self._follow()
        finally:
            # Said as it stops (SIGTERM, SIGINT, a crash): the registry stops counting this node
            # as watching at once, instead of after nodes.stale_after_seconds.
            self.stop.set()
            self.check_in(stopped=True)

    def _follow(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                caught_up = False
                for event in self.client.events(
                    last_event_id=self.state.last_event_id,
                    types=WATCH_EVENT_TYPES,
                    idle_timeout=self.idle_timeout,
                ):
                    if not caught_up:
                        # The stream's first message is its starting point: what moved before
                        # it is caught up by resolving every watch, what moves after it comes
                        # as events. Nothing falls between the two.
                        if failures:
                            self.report("event stream back")
                        failures = 0
                        self.catch_up()
                        caught_up = True
                    self.handle(event)
                    if self.stop.is_set():
                        return
            except (ConnectionFailed, RegistryError, OSError) as exc:
                failures += 1
                wait = self._backoff(failures)
                self.report(f"event stream down ({_short(exc)}); polling, next try in {wait:.1f} s")
                try:
                    self.catch_up()
                except (ConnectionFailed, OSError) as down:
                    self.report(f"registry unreachable ({_short(down)})")
                self.stop.wait(wait)  # blocks: no CPU while waiting

    # -- check-ins ---------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        """A check-in every ``checkin_seconds`` (the registry ages out silent nodes); the thread
        sleeps in between."""
        while not self.stop.wait(self.checkin_seconds):
            self.check_in()

    def check_in(self, *, stopped: bool = False) -> None:
        """Tell the registry what this node watches and has warm (``POST /api/v1/nodes/checkin``);
        a registry that cannot take it (down, older) only costs a line in the log. The opt-out
        (``TENSOR_REGISTRY_NO_CHECKIN``) stops these too: rollouts then never see this node.
        ``stopped``: the last one, as the agent stops."""
        if not checkins.enabled() or (self.stop.is_set() and not stopped):
            return  # stopping: only the last check-in (stopped) goes out
        try:
            checkins.post(self.client, self.checkin_body(stopped=stopped))
            if stopped:
                self.report("told the registry this agent stopped")
            if self._checkin_failed:
                self.report("check-ins accepted again")
            self._checkin_failed = False
        except (RegistryError, OSError) as exc:
            if not self._checkin_failed:
                self.report(f"check-in failed ({_short(exc)})")
            self._checkin_failed = True

    def checkin_body(self, *, stopped: bool = False) -> dict[str, Any]:
        warm = dict(self.state.warm)
        watches = []
        for watch in self.watches[: checkins.MAX_WATCHES]:
            entry = warm.get(watch.label) or {}
            error = entry.get("failed") or entry.get("pending")
            if entry.get("failed"):
                state = "failed"
            elif entry.get("pending") or not entry.get("artifact_id"):
                state = "pending"
            else:
                state = "warm"
            # Pending on a version nothing of which matches the watch: that version (a rollout
            # names such nodes as unable to become warm).
            version = entry.get("version")
            if state == "pending" and entry.get("pending_version") is not None:
                version = entry["pending_version"]
            watches.append(
                {
                    "model": watch.model,
                    "ref": watch.ref,
                    "state": state,
                    "version": version,
                    "artifact_id": entry.get("artifact_id"),
                    "error": error[:500] if isinstance(error, str) else None,
                }
            )
        # What the node cache holds whole (pulls and loads count too), and what a watch is warm on.
        cached = set(self.cache.artifacts())
        cached.update(
            e["artifact_id"] for e in warm.values() if e.get("artifact_id") and not e.get("failed")
        )
        # No ``loaded``: the agent loads nothing, and leaving it out keeps what loads reported.
        return checkins.body(
            self.node_id,
            watches=watches,
            cached=sorted(cached)[: checkins.MAX_CACHED],
            stopped=stopped,
        )

    def _backoff(self, failures: int) -> float:
        ceiling = min(self.max_backoff, 2.0 ** (failures - 1))
        return ceiling * (0.5 + 0.5 * random.random())  # jitter, not a secret

    def handle(self, event: dict[str, Any]) -> None:
        for watch in self.watches:
            if watch.concerns(event):
                self.report(f"event {event.get('id')} {event.get('type')} concerns {watch.label}")
                self.warm_watch(watch)
        if event.get("id") is not None:
            self.state.last_event_id = str(event["id"])
            self.state.save()

    def catch_up(self) -> None:
        for watch in self.watches:
            if self.stop.is_set():
                return
            self.warm_watch(watch)
        self.check_in()

    # -- retries -------------------------------------------------------------------------------
    def _retry_failed(self) -> None:
        """Try failed watches again when their backoff has passed; sleeps in between."""
        while not self.stop.is_set():
            with self._retry_changed:
                due = min((at for _, at in self._retries.values()), default=None)
                wait = RETRY_IDLE_SECONDS if due is None else due - time.monotonic()
                if wait > 0:
                    self._retry_changed.wait(timeout=wait)
                    continue
            now = time.monotonic()
            for watch in self.watches:
                entry = self._retries.get(watch.label)
                if entry is None or entry[1] > now or self.stop.is_set():
                    continue
                self.report(f"{watch.label}: trying the pre-pull again (attempt {entry[0] + 1})")
                try:
                    self.warm_watch(watch)
                except (ConnectionFailed, OSError) as exc:
                    self.report(f"{watch.label}: registry unreachable ({_short(exc)})")
                except Exception as exc:  # a bug: reported, and tried again after the backoff
                    log.debug("retry failed", exc_info=True)
                    self.report(f"{watch.label}: {type(exc).__name__}: {_short(exc)}")

    def _schedule_retry(self, label: str, failed: bool) -> None:
        with self._retry_changed:
            if not failed:
                self._retries.pop(label, None)
                return
            count = self._retries.get(label, (0, 0.0))[0] + 1
            self._retries[label] = (count, time.monotonic() + self._backoff(count))
            self._retry_changed.notify()

    # -- pre-pull ------------------------------------------------------------------------------
    def warm_watch(self, watch: Watch) -> bool:
        """Resolve ``watch`` and make sure its artifact is in the cache; True when warm. A
        failure (reported, and kept in the state for check-ins) is tried again later."""
        with self._warming:
            try:
                warm = self._warm_watch(watch)
            except Exception:  # unreachable, or the state file unwritable: later, not now
                self._schedule_retry(watch.label, failed=True)
                raise
            failed = bool((self.state.warm.get(watch.label) or {}).get("failed"))
            self._schedule_retry(watch.label, failed=failed and not warm)
            return warm

    def _warm_watch(self, watch: Watch) -> bool:
        try:
            resolution = self.client.resolve(watch.model, watch.ref, **watch.filters)
        except NotFound as exc:
            self.report(f"{watch.label}: nothing to pre-pull yet ({_short(exc)})")
            current = self.state.warm.get(watch.label) or {}
            tried = exc.problem.get("version")
            self.state.warm[watch.label] = {
                **current,
                "pending": _short(exc),
                "pending_version": tried if isinstance(tried, int) else None,
            }
            self.state.save()
            self.check_in()
            return False
        except ConnectionFailed:
            raise
        except (RegistryError, UnsafePath) as exc:
            self.report(f"{watch.label}: resolve failed ({_short(exc)})")
            current = self.state.warm.get(watch.label) or {}
            self.state.warm[watch.label] = {**current, "failed": _short(exc)}
            self.state.save()
            self.check_in()
            return False
        current = self.state.warm.get(watch.label) or {}
        try:
            # Reading the answer's files applies the path rule: a tampered answer's unsafe path
            # fails here (UnsafePath), and is a refused target, never the agent's exit.
            if current.get("artifact_id") == resolution.artifact_id and self._cached(resolution):
                if "failed" in current:  # a failed move since, and the alias came back
                    self.state.warm[watch.label] = {
                        k: v for k, v in current.items() if k != "failed"
                    }
                    self.state.save()
                    self.check_in()
                return True
            downloaded = self.prepull(resolution, watch=watch.label)
        except ConnectionFailed:
            raise
        except Exception as exc:  # refused, a bug or the disk: reported, and it keeps watching
            if not isinstance(exc, RegistryError | UnsafePath):
                log.debug("pre-pull failed", exc_info=True)
            known = isinstance(exc, RegistryError | UnsafePath)
            reason = _short(exc) if known else f"{type(exc).__name__}: {_short(exc)}"
            self.report(f"{watch.label}: pre-pull of {_artifact(resolution)} failed ({reason})")
            self.state.warm[watch.label] = {**current, "failed": reason}
            self.state.save()
            self.check_in()
            return False
        self.state.warm[watch.label] = {
            "artifact_id": resolution.artifact_id,
            "version": resolution.version,
            "files": [f.sha256 for f in resolution.files],
            "warmed_at": time.time(),
        }
        self.state.save()
        self.check_in()
        self.report(
            f"{watch.label}: warm on version {resolution.version} (artifact "
            f"{resolution.artifact_id}, {format_size(downloaded)} downloaded)"
        )
        return True

    def _cached(self, resolution: Resolution) -> bool:
        key = resolution.data.get("compatibility_key")
        return all(
            self.cache.contains(f.sha256, f.size, compatibility_key=key) for f in resolution.files
        )

    def prepull(self, resolution: Resolution, *, watch: str) -> int:
        """Verify, make room, download (under the artifact's node-wide lock); bytes downloaded."""
        # The signed manifest first: nothing is fetched for an answer that fails it.
        verify_resolution(self.client, resolution)
        with self.cache.lock(resolution.artifact_id):
            if self._cached(resolution):
                return 0  # another process pulled it while we waited for the lock
            self._make_room(resolution, watch)
            _, downloaded, _ = self.cache.fetch_resolution(
                self.client, resolution, readers=self.readers
            )
            return downloaded

    def _make_room(self, resolution: Resolution, watch: str) -> None:
        """Prune down to the budget minus what ``resolution`` still needs. Kept: its own files,
        what the other watches are warm on, and objects placed by hard link (in use by a
        serving directory). The version ``watch`` moved away from may go, unless in use."""
        if self.max_cache_bytes is None:
            return
        needed = sum(f.size for f in resolution.files if not self.cache.contains(f.sha256, f.size))
        keep = {f.sha256 for f in resolution.files}
        for label, warm in self.state.warm.items():
            if label != watch:
                keep.update(warm.get("files") or [])
        self.cache.prune(max(0, self.max_cache_bytes - needed), keep=keep, keep_linked=True)
        if self.cache.size() + needed > self.max_cache_bytes:
            raise RegistryError(
                f"artifact {resolution.artifact_id} needs {format_size(needed)} and the cache "
                f"budget ({format_size(self.max_cache_bytes)}) is held by what this node uses",
                code="cache_budget_exceeded",
            )


def _short(exc: BaseException, limit: int = 200) -> str:
    """One line of at most ``limit`` characters, cut between words (a word longer than the
    whole limit, such as a URL, is kept whole rather than cut)."""
    words = str(exc).split()
    text = " ".join(words)
    if len(text) <= limit:
        return text
    kept: list[str] = []
    for word in words:
        if kept and len(" ".join([*kept, word])) > limit - 4:
            break
        kept.append(word)
    return " ".join(kept) + " ..."


def _artifact(resolution: Resolution) -> str:
    """The answer's artifact id for a message, whatever shape a tampered answer has."""
    try:
        return str(resolution.artifact_id)
    except Exception:
        return "the answer's artifact"


class Stopped(BaseException):
    """SIGTERM or SIGINT: the agent ends (state is saved by atomic replace, never half)."""


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM (systemd, Kubernetes) and SIGINT end the agent at once, even in a blocking read."""

    def handler(_signum: int, _frame: object) -> None:
        stop.set()
        raise Stopped

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
