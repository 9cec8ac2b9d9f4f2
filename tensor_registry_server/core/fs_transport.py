"""The embedded broker's transport: kombu's file-system transport with atomic message files.

kombu 5.x writes a message by opening the message's final name and then writing into it, and a
consumer polling the folder moves and reads any file with a matching name, without the writer's
lock. A consumer that comes between the two reads half a JSON document, and the worker stops
("Unrecoverable error: JSONDecodeError"; seen once in the test suite with the embedded
``serve``). Here a message is written under a name consumers skip (a leading dot) and renamed
to its final name once complete: a rename within one directory is atomic, so a consumer sees a
whole message or none. A consumed message is moved into the broker's own ``processed_folder``
(owner-only, under data_dir) and removed after reading, not into the system's temp dir as
kombu does without ``store_processed``.

Selected with Celery's ``broker_transport`` (tensor_registry_server.core.broker) for ``filesystem://``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from queue import Empty
from time import monotonic_ns
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

TRANSPORT = "tensor_registry_server.core.fs_transport:Transport"


class Channel(filesystem.Channel):
    # kombu's own stubs disagree on the name of the second parameter (message / payload).
    def _put(self, queue: Any, message: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # Nanoseconds, zero-padded: names sort in the order they were sent (kombu's
        # milliseconds left two messages of one millisecond in random order).
        name = f"{monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb") as f:
                self._write_message(f, str_to_bytes(dumps(message)))
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc

    @staticmethod
    def _write_message(f: Any, data: bytes) -> None:
        f.write(data)

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            # Only whole messages of this queue (a file being written starts with a dot).
            if name.startswith(".") or name.partition(".")[2] != wanted:
                continue
            taken = os.path.join(self.processed_folder, name)
            try:
                os.replace(os.path.join(self.data_folder_in, name), taken)
            except OSError:
                continue  # another consumer took it first
            try:
                with open(taken, "rb") as f:
                    payload = f.read()
                if not self.store_processed:
                    os.remove(taken)
            except OSError as exc:
                raise ChannelError(f"Cannot read file {name!r} from queue.") from exc
            return loads(bytes_to_str(payload))
        raise Empty()


class Transport(filesystem.Transport):
    Channel = Channel

    @property
    def default_connection_params(self) -> dict[str, Any]:
        """No host: messages are files under data_dir. kombu's virtual transports default to
        ``localhost`` and warn "No hostname was supplied" on every connection that names none
        (each start logged it twice, worker and API); a file-system broker has none to supply."""
        return {"port": None, "hostname": None}

    def drain_events(self, connection: Any, timeout: Any = None, **_: Any) -> Any:
        """Wait at most one polling interval, not the 2 s Celery's loop asks for: the worker
        checks for a pending shutdown between waits, so a stop (SIGTERM from ``serve`` or a
        test) no longer waits out the rest of a 2 s wait. Polling itself is unchanged."""
        interval = self.polling_interval
        if interval and (timeout is None or timeout > interval):
            timeout = interval
        return super().drain_events(connection, timeout=timeout)
