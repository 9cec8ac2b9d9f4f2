"""Shell completion scripts generated from the argparse tree (no extra dependency).

The script holds, for every command path ("", "alias", "alias set", ...), the words that may
follow: subcommands and options. The shell function joins the non-option words typed so far
into that path and offers what matches; option values (choices) are offered after an option
that has them. zsh loads the same function through bashcompinit. `tensor-registry completion
bash|zsh` prints it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def register(sub: SubParsers) -> None:
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script: `source <(tensor-registry completion bash)` "
        "in ~/.bashrc, or `source <(tensor-registry completion zsh)` in ~/.zshrc.",
    )
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    # The whole command tree, so cli.py is imported here and not at the top (it imports us).
    from tensor_registry.cli.main import build_parser

    sys.stdout.write(script(build_parser(), args.shell))
    return 0


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(
    parser: argparse.ArgumentParser,
    path: str,
    words: dict[str, list[str]],
    values: dict[str, list[str]],
) -> None:
    children = _subparsers(parser)
    options = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        options += [o for o in action.option_strings if o.startswith("--") or len(o) <= 3]
        if (
            action.option_strings
            and action.choices
            and not isinstance(action, argparse._SubParsersAction)
        ):
            for option in action.option_strings:
                values[f"{path}|{option}".strip()] = [str(c) for c in action.choices]
        elif not action.option_strings and action.choices and not children:
            values[f"{path}|"] = [str(c) for c in action.choices]
    words[path] = sorted(children) + sorted(set(options))
    for name, child in children.items():
        _walk(child, f"{path} {name}".strip(), words, values)


def _bash(parser: argparse.ArgumentParser) -> str:
    words: dict[str, list[str]] = {}
    values: dict[str, list[str]] = {}
    _walk(parser, "", words, values)
    entries = "\n".join(
        f"    [{shlex.quote(k or '_')}]={shlex.quote(' '.join(v))}"
        for k, v in sorted(words.items())
    )
    choices = "\n".join(
        f"    [{shlex.quote(k)}]={shlex.quote(' '.join(v))}" for k, v in sorted(values.items())
    )
    return f"""# tensor-registry completion (bash). Load: source <(tensor-registry completion bash)
_tensor_registry() {{
  local -A words=(
{entries}
  )
  local -A values=(
{choices}
  )
  local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="" path="" i w
  ((COMP_CWORD > 1)) && prev="${{COMP_WORDS[COMP_CWORD-1]}}"
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${{COMP_WORDS[i]}}"
    [[ "$w" == -* ]] && continue
    if [[ -n "${{words[${{path:+$path }}$w]+x}}" ]]; then path="${{path:+$path }}$w"; fi
  done
  if [[ "$prev" == -* && -n "${{values[$path|$prev]+x}}" ]]; then
    COMPREPLY=($(compgen -W "${{values[$path|$prev]}}" -- "$cur"))
    return
  fi
  local offer="${{words[${{path:-_}}]}}"
  [[ -n "${{values[$path|]+x}}" && "$cur" != -* ]] && offer="${{values[$path|]}}"
  COMPREPLY=($(compgen -W "$offer" -- "$cur"))
  [[ ${{#COMPREPLY[@]}} -eq 0 ]] && COMPREPLY=($(compgen -f -- "$cur"))
  return 0
}}
complete -F _tensor_registry tensor-registry
"""


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    if shell == "bash":
        return _bash(parser)
    if shell == "zsh":
        return (
            "# tensor-registry completion (zsh). Load: source <(tensor-registry completion zsh)\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + _bash(parser)
        )
    raise ValueError(f"no completion for {shell!r}")
