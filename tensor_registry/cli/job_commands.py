"""`tensor-registry jobs ls | show | follow | cancel`, and following a job to its end (which
`tensorize --wait` does too).
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import RegistryClient, RegistryError
from tensor_registry.cli.flags import command_group, connection_parser, json_flag, model_only
from tensor_registry.cli.output import (
    format_size,
    format_time,
    job_makes,
    job_storage,
    print_fields,
    print_json,
    print_table,
    progress_bar,
    say,
)
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers

FINAL = ("succeeded", "failed", "cancelled")


def register(sub: SubParsers) -> None:
    common, as_json = connection_parser(), json_flag()
    jobs = command_group(sub, "jobs", "list, show, follow and cancel jobs")
    ls = jobs.add_parser("ls", parents=[common, as_json], help="recent jobs, newest first")
    ls.add_argument("--model", metavar="NS/NAME")
    ls.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    ls.add_argument("--kind", choices=["tensorize", "import", "verify"])
    ls.add_argument("--limit", type=int, default=50)
    ls.set_defaults(func=with_registry(cmd_jobs_ls))
    show = jobs.add_parser("show", parents=[common, as_json], help="one job")
    show.add_argument("job_id", metavar="JOB_ID")
    show.set_defaults(func=with_registry(cmd_jobs_show))
    follow = jobs.add_parser(
        "follow",
        parents=[common, as_json],
        help="follow a job to its end (Ctrl-C leaves it running)",
    )
    follow.add_argument("job_id", metavar="JOB_ID")
    follow.set_defaults(func=with_registry(cmd_jobs_follow))
    cancel = jobs.add_parser(
        "cancel",
        parents=[common, as_json],
        help="cancel a job; a running one stops at its worker's next progress report, "
        "which this waits for (--no-wait: print the state now)",
    )
    cancel.add_argument("job_id", metavar="JOB_ID")
    cancel.add_argument(
        "--no-wait",
        action="store_true",
        help="return at once instead of waiting until a running job has stopped",
    )
    cancel.add_argument(
        "--timeout", type=float, default=120, metavar="SECONDS", help="longest wait (120)"
    )
    cancel.set_defaults(func=with_registry(cmd_jobs_cancel))


def _progress(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {}
    done, total = progress.get("bytes_done"), progress.get("bytes_total")
    text = str(progress.get("stage") or "-")
    if total:
        text += f" {format_size(done or 0)}/{format_size(total)}"
    return text


def cmd_jobs_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    model_id = str(client.get_model(model_only(args.model))["id"]) if args.model else None
    items = client.list_jobs(
        model_id=model_id, status=args.status, kind=args.kind, limit=args.limit
    )
    if args.json:
        print_json(items)
        return 0
    print_table(
        ["ID", "KIND", "STATUS", "MAKES", "STORAGE", "PROGRESS", "CREATED"],
        [
            [
                j["id"],
                j["kind"],
                _status(j),
                job_makes(j),
                job_storage(j),
                _progress(j),
                format_time(j["created_at"]),
            ]
            for j in items
        ],
    )
    return 0


def cmd_jobs_show(args: argparse.Namespace, client: RegistryClient) -> int:
    job = client.get_job(args.job_id)
    if args.json:
        print_json(job)
        return 0
    error = job.get("error") or {}
    print_fields(
        [
            ("id", job["id"]),
            ("kind", job["kind"]),
            ("status", _status(job)),
            ("makes", job_makes(job)),
            ("storage", job_storage(job)),
            ("progress", _progress(job)),
            ("attempts", job["attempts"]),
            ("artifact", job.get("artifact_id")),
            ("worker", job.get("worker")),
            ("created", format_time(job["created_at"])),
            ("started", format_time(job.get("started_at"))),
            ("finished", format_time(job.get("finished_at"))),
            ("error", f"{error.get('detail')} ({error.get('code')})" if error else None),
        ]
    )
    return 0


def cmd_jobs_follow(args: argparse.Namespace, client: RegistryClient) -> int:
    job = client.get_job(args.job_id)  # a wrong id fails here, before any stream opens
    say(f"job {job['id']} ({job['kind']}) {job['status']}")
    return follow_job(client, str(job["id"]), as_json=args.json)


def _status(job: dict[str, Any]) -> str:
    """The status, and for a running job that was asked to stop, that it is stopping."""
    if job["status"] in ("queued", "running") and job.get("cancel_requested"):
        return "cancelling"
    return str(job["status"])


def cmd_jobs_cancel(args: argparse.Namespace, client: RegistryClient) -> int:
    """Prints the state the cancel left: `cancelled`, or (--no-wait, or the worker did not
    stop within --timeout) `cancelling`, never a bare `running`."""
    job = client.cancel_job(args.job_id)
    if not args.no_wait and job["status"] not in FINAL:
        deadline = time.monotonic() + args.timeout
        say(f"job {job['id']} is running: waiting for its worker to stop it")
        while job["status"] not in FINAL and time.monotonic() < deadline:
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            job = client.get_job(str(job["id"]))
    if args.json:
        print_json(job)
    else:
        print(f"job {job['id']} {_status(job)}")
    if job["status"] not in FINAL:
        say(
            f"the worker stops it at its next progress report: "
            f"tensor-registry jobs follow {job['id']}"
        )
    return 0


def _catch_interrupts(interrupted: threading.Event) -> Any:
    """Ctrl-C while following: remember it, then raise KeyboardInterrupt as Python does.

    Python runs signal handlers between bytecodes, also inside a finaliser (a ``__del__`` run by
    the garbage collector), where an exception is printed and dropped: a Ctrl-C landing there
    was lost and the command went on following (a test saw it hang). The flag survives that;
    the follow loop checks it on every line of the event stream (a keep-alive at least every
    15 s) and between polls. Returns the handler to restore (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_sigint(signum: int, frame: Any) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, on_sigint)


def follow_job(client: RegistryClient, job_id: str, *, as_json: bool = False) -> int:
    """Follow a job to its end with a progress bar; prints the artifact id (or the job id).

    Ctrl-C stops following, not the job: it keeps running on the registry, so say how to get
    back to it (`jobs follow`) or stop it (`jobs cancel`).
    """
    bar = progress_bar(None, "queued")
    lock = threading.Lock()
    job: dict[str, Any] = {}

    def update(job: dict[str, Any]) -> None:
        progress = job.get("progress") or {}
        with lock:
            bar.set_description(f"{job.get('status')}: {progress.get('stage', '')}")
            if progress.get("bytes_total"):
                bar.total = progress["bytes_total"]
            bar.n = int(progress.get("bytes_done") or 0)
            bar.refresh()

    interrupted = threading.Event()
    previous = _catch_interrupts(interrupted)
    try:
        say(f"following job {job_id} (Ctrl-C stops following; the job keeps running)")
        job = client.wait_job(job_id, on_update=update, stop=interrupted.is_set)
    except KeyboardInterrupt:
        bar.close()
        say(
            f"stopped following job {job_id}; it keeps running on the registry.\n"
            f"  follow it again: tensor-registry jobs follow {job_id}\n"
            f"  stop it:         tensor-registry jobs cancel {job_id}"
        )
        return 130
    finally:
        bar.close()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if job["status"] == "succeeded":
        say(f"job {job_id} succeeded: artifact {job.get('artifact_id')}")
        if as_json:
            print_json(job)
        else:
            print(job.get("artifact_id") or job_id)
        return 0
    error = job.get("error") or {}
    raise RegistryError(
        f"job {job_id} {job['status']}: {error.get('detail') or 'no detail'}",
        code=error.get("code") or f"job_{job['status']}",
    )
