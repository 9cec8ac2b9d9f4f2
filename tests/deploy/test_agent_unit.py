"""The systemd unit of the node agent runs a command the CLI accepts."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

from tensor_registry.cli.main import build_parser

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "tensor-registry-agent.service"


def test_the_agent_unit_starts_the_agent_with_flags_it_accepts() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text().replace("\\\n", " "))
    words = shlex.split(unit["Service"]["ExecStart"])
    assert words[0].endswith("/tensor-registry") and words[1] == "agent"
    args = build_parser().parse_args(words[1:])
    assert args.watch == ["acme/llama-3-8b:prod"] and args.dtype == "bfloat16"
    assert callable(args.func)
    assert unit["Service"]["Restart"] == "always"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
