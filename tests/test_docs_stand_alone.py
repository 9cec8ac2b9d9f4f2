"""The project's docs stand on their own: a clone has no `../shared/` folder, so nothing in the
repository may point there, and the contract and threat model the code follows are in docs/."""

from __future__ import annotations

import re
import subprocess

from harness.serve_process import ROOT


def _tracked() -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    return [name for name in listed if name and (ROOT / name).is_file()]


def test_no_file_in_the_repository_points_at_the_shared_folder() -> None:
    pointing = re.compile(r"\.\./shared\b|\bshared/(API|SECURITY|ARCHITECTURE)\.md")
    found = []
    for name in _tracked():
        if name == "tests/test_docs_stand_alone.py":
            continue
        try:
            text = (ROOT / name).read_text()
        except (UnicodeDecodeError, OSError):
            continue
        found += [
            f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if pointing.search(line)
        ]
    assert not found, found


def test_the_contract_and_threat_model_are_in_docs_and_linked() -> None:
    api = (ROOT / "docs" / "api.md").read_text()
    threat = (ROOT / "docs" / "threat-model.md").read_text()
    for route in ("/api/v1/resolve", "/api/v1/webhooks", "/api/v1/events", "/api/v1/nodes"):
        assert route in api, route
    assert "no_matching_artifact" in api and "chosen_by" in api
    # The ten rules the code cites by number ("docs/threat-model.md rule 8").
    assert [int(n) for n in re.findall(r"^(\d+)\. \*\*", threat, re.M)] == list(range(1, 11))
    readme = (ROOT / "README.md").read_text()
    assert "docs/api.md" in readme and "docs/threat-model.md" in readme
