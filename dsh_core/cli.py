"""The ``dsh`` command line. Subcommands come from ``dsh_register_commands``."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pluggy

from .diag import warn
from .errors import DshError
from .hardening import harden


@dataclass
class Command:
    name: str
    help: str
    setup: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None


class CommandRegistry:
    def __init__(self) -> None:
        self.commands: dict[str, Command] = {}

    def add(
        self,
        name: str,
        *,
        help: str,
        setup: Callable[[argparse.ArgumentParser], None],
        run: Callable[[argparse.Namespace], int],
        description: str | None = None,
    ) -> None:
        if name in self.commands:
            raise DshError(f"two plugins register the command `dsh {name}`")
        self.commands[name] = Command(name, help, setup, run, description)


def _command_manager(argv: Sequence[str]) -> pluggy.PluginManager:
    from .builtin import commands as builtin_commands
    from .host import installed_plugins, register_plugin

    pm = builtin_commands.plugin_manager(trace=False)
    # Builtin subcommands (run, plugins, examples) need no plugin imports: skipping them keeps
    # `dsh run` start-up at the spine's import cost (~60 ms less with httpx-based plugins installed).
    first = next((a for a in argv if not a.startswith("-")), None)
    if first in builtin_commands.NAMES:
        return pm
    from .stdio import stdout_to_stderr

    with stdout_to_stderr():  # an import-time print must not pollute the command's output
        for name, ep in installed_plugins().items():
            try:
                register_plugin(pm, ep.load(), name)
            except Exception as exc:
                warn(f"plugin {name!r} failed to load for its commands: {exc!r}")
    return pm


def build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, CommandRegistry]:
    registry = CommandRegistry()
    _command_manager(argv).hook.dsh_register_commands(commands=registry)
    parser = argparse.ArgumentParser(
        prog="dsh",
        description=(
            "dsh — an agent harness for automation. It serves agents over the Agent Client Protocol "
            "(stdio) from named examples: compositions of plugins."
        ),
        epilog="Start here: dsh ask --provider scripted --model demo.json ping (prints PONG, keyless); "
        "dsh examples; dsh doctor. `dsh run` speaks ACP (JSON-RPC) on stdin/stdout, for a client to drive.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"dsh {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in sorted(registry.commands.values(), key=lambda c: c.name):
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description or cmd.help)
        cmd.setup(p)
        p.set_defaults(_run=cmd.run, _parser=p)
    return parser, registry


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser, _ = build_parser(argv)
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the command's own parser, with its usage line (argparse's top one names dsh)
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
        if not getattr(args, "_run", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args._run(args) or 0)
    except DshError as exc:
        print(f"dsh: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # task groups wrap errors; show ours plainly
        mine, rest = group.split(DshError)
        if mine is None or rest is not None:
            raise
        for leaf in _leaves(mine):
            print(f"dsh: {leaf}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def entry() -> None:  # pragma: no cover - the process entry point (the `dsh` script, python -m dsh_core.cli)
    """Run ``main`` and end the process without tearing the interpreter down object by object.

    By the time ``main`` returns everything that has an owner is closed (agents disposed,
    logs flushed, lifespans ended); freeing a 10,000-session host's objects one by one during
    interpreter finalization added ~0.4 s to every exit. Exit handlers still run.

    First of all the process hardens itself (``dsh_core.hardening``): non-dumpable, and the
    credentials it was started with wiped from the environment block the kernel shows in
    ``/proc/<pid>/environ``, before any plugin or child runs.
    """
    harden()
    code = main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
