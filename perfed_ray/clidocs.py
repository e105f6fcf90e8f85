"""The command-line reference: every command, argument and exit status of `perfed-ray`,
read from the argparse parser that parses them, so docs/reference/cli.md can never
offer a flag the command lacks or miss one it has (the docs site regenerates it at
build time, as it does the configuration reference)."""

from __future__ import annotations

import argparse

from perfed_ray.cli import parser
from perfed_ray.markdown import table


def _name(action: argparse.Action) -> str:
    """An argument as typed: `dir`, or `--set KEY=VALUE`, or `--quiet`."""
    if not action.option_strings:
        return action.metavar or action.dest
    takes = action.nargs != 0
    value = f" {action.metavar or action.dest.upper()}" if takes else ""
    return ", ".join(action.option_strings) + value


def _usage(command: argparse.ArgumentParser) -> str:
    """The usage lines at a fixed width: argparse wraps at the terminal's, which would
    make the reference depend on the window it was generated in."""
    formatter = argparse.HelpFormatter(command.prog, width=88)
    formatter.add_usage(command.usage, command._actions, command._mutually_exclusive_groups)
    return f"```text\n{formatter.format_help().strip()}\n```"


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:].replace("%%", "%") + "."


def _commands(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _arguments(command: argparse.ArgumentParser) -> str:
    rows = []
    for action in command._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        meaning = (action.help or "").replace("%%", "%")
        if isinstance(action, argparse._AppendAction):
            meaning += " (repeatable)" if "repeatable" not in meaning else ""
        rows.append((f"`{_name(action)}`", meaning))
    return table(("argument", "meaning"), rows)


def reference_text() -> str:
    """The whole reference as Markdown: the command's own description, then one section
    per subcommand (its purpose, usage, arguments and exit statuses)."""
    top = parser()
    helps = {
        a.dest: a.help
        for s in top._actions
        if isinstance(s, argparse._SubParsersAction)
        for a in s._choices_actions
    }
    parts = [
        "### `perfed-ray`",
        _usage(top),
        top.description.strip().replace("``", "`"),
        _arguments(top),
    ]
    for name, command in _commands(top).items():
        parts += [
            f"### `perfed-ray {name}`",
            _sentence(helps[name]),
            _usage(command),
            _arguments(command),
            _sentence(command.epilog),
        ]
    return "\n\n".join(parts)
