"""``dsh ask``: a headless one-shot ACP client.

Spawns an example as an ACP agent (``dsh run --example …``, or any ACP agent with
``--agent-command``) through the ACP client module, sends the task as one text prompt,
streams the committed answer to stdout, and exits:

- 0 on ``end_turn``; 130 on ``cancelled`` (the first Ctrl-C sends ``session/cancel``, a
  second one kills the agent's process tree); 124 when ``--timeout`` expires;
- 1 when the agent fails (the message, with the tail of the agent's stderr, on stderr);
``--resume ID`` continues a recorded session (``session/resume``) instead of opening one;
``--session-list`` prints the recorded sessions (``session/list``: id, updatedAt, cwd,
title; tab-separated, or a JSON array with ``--json``) and exits.

  2 for bad usage; 3 for another stop reason (``max_tokens``, ``refusal``, …).

stdout carries the answer only (or, with ``--json``, one object: stopReason, text,
sessionId, and error on failure). A spinner with the elapsed time is drawn on stderr,
and only when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from typing import Any

import anyio
import anyio.to_thread
from dsh_acp.client import (
    AcpClient,
    AcpClientError,
    PermissionAsk,
    PermissionVerdict,
    PromptResult,
    open_client,
)

from dsh_core.compose import example_argument

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_OTHER_STOP = 3
EXIT_TIMEOUT = 124
EXIT_CANCELLED = 130

CANCEL_GRACE = 3.0  # after session/cancel (timeout path), how long the agent gets to settle


def setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", nargs="?", help="the task, sent as one text prompt")
    p.add_argument("--resume", metavar="ID", help="continue the recorded session ID (session/resume) instead of a new one")
    p.add_argument(
        "--session-list",
        action="store_true",
        help="list the agent's recorded sessions (session/list), newest first, and exit; --cwd filters",
    )
    p.add_argument("--example", "-e", default="acp-agent", help="example to run as the agent (default: acp-agent)")
    p.add_argument("--cwd", help="the session's working directory (default: the current directory)")
    p.add_argument("--provider", help="model provider of the exact route (env DSH_PROVIDER)")
    p.add_argument("--model", help="model id of the exact route (env DSH_MODEL); for scripted: a script path")
    p.add_argument(
        "--approve",
        choices=("deny", "allow", "ask"),
        default="deny",
        help="answer the agent's permission requests: deny (default), allow, or ask on the terminal",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (stopReason, text, sessionId) at the end")
    p.add_argument("--timeout", type=float, metavar="S", help="cancel after S seconds (exit 124)")
    p.add_argument(
        "--agent-command",
        metavar="CMD",
        help="drive this ACP agent command line (shell-split) instead of `dsh run --example …`",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="forward the agent's stderr")


def agent_argv(args: argparse.Namespace) -> list[str]:
    if args.agent_command:
        argv = shlex.split(args.agent_command)
        if not argv:
            raise ValueError("--agent-command is empty")
        return argv
    argv = [sys.executable, "-m", "dsh_core.cli", "run", "--example", example_argument(args.example)]
    if args.provider:
        argv += ["--provider", args.provider]
    if args.model:
        model = args.model
        if os.path.exists(model):  # a script path relative to where `dsh ask` runs, not to --cwd
            model = os.path.abspath(model)
        argv += ["--model", model]
    return argv


class _Spinner:
    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.started = time.monotonic()
        self.paused = False
        self.shown = False

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.shown = False

    async def run(self, label: str = "working") -> None:
        if not self.enabled:
            return
        i = 0
        try:
            while True:
                if not self.paused:
                    elapsed = time.monotonic() - self.started
                    sys.stderr.write(f"\r\033[K{self.FRAMES[i % len(self.FRAMES)]} {label} {elapsed:5.1f}s")
                    sys.stderr.flush()
                    self.shown = True
                    i += 1
                await anyio.sleep(0.1)
        finally:
            self.clear()


def _ask_terminal(question: str) -> bool:
    """Ask y/N on the controlling terminal; no terminal → False."""
    try:
        with open("/dev/tty", "r+", encoding="utf-8", errors="replace") as tty:
            tty.write(question)
            tty.flush()
            return tty.readline().strip().lower() in ("y", "yes")
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    try:
        argv = agent_argv(args)
    except ValueError as exc:
        print(f"dsh ask: {exc}", file=sys.stderr)
        return EXIT_USAGE
    cwd = os.path.abspath(args.cwd or os.getcwd())
    if not os.path.isdir(cwd):
        print(f"dsh ask: --cwd {args.cwd!r} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    if args.session_list:
        if args.task or args.resume:
            print("dsh ask: --session-list takes no task and no --resume", file=sys.stderr)
            return EXIT_USAGE
        return anyio.run(_list, args, argv, cwd)
    if args.task is None:
        print("dsh ask: a task is required (or --session-list)", file=sys.stderr)
        return EXIT_USAGE
    if args.timeout is not None and args.timeout <= 0:
        print("dsh ask: --timeout must be a positive number of seconds", file=sys.stderr)
        return EXIT_USAGE
    if not args.task.strip():
        print("dsh ask: the task is empty", file=sys.stderr)
        return EXIT_USAGE
    return anyio.run(Ask(args, argv, cwd).run)


async def _list(args: argparse.Namespace, argv: list[str], cwd: str) -> int:
    """``--session-list``: one line per session (id, updatedAt, cwd, title), or one JSON array."""
    try:
        async with open_client(argv, cwd=cwd, env=dict(os.environ)) as client:
            sessions = await client.list_sessions(cwd if args.cwd else None)
    except AcpClientError as exc:
        print(f"dsh ask: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        sys.stdout.write(json.dumps(sessions) + "\n")
    else:
        for s in sessions:
            title = (s.get("title") or "").replace("\t", " ")
            sys.stdout.write(f"{s.get('sessionId')}\t{s.get('updatedAt', '')}\t{s.get('cwd')}\t{title}\n")
    sys.stdout.flush()
    return EXIT_OK


class Ask:
    """One ``dsh ask`` run: spawn the agent, send the task, stream the answer, pick the exit status.

    The first Ctrl-C (or ``--timeout``) sends ``session/cancel``; a second Ctrl-C, SIGTERM, or the
    timeout's grace running out kills the agent's process tree."""

    def __init__(self, args: argparse.Namespace, argv: list[str], cwd: str) -> None:
        self.args, self.argv, self.cwd = args, argv, cwd
        self.client: AcpClient | None = None
        self.cancels = 0
        self.killed = False
        self.timed_out = False
        self.streamed = False
        self.last_char = "\n"
        self.spinner = _Spinner()
        self.stdout_is_tty = sys.stdout.isatty()

    # ------------------------------------------------------------------ the client's callbacks

    def on_text(self, text: str) -> None:
        if self.args.json:
            return
        if self.stdout_is_tty:
            self.spinner.clear()
            self.spinner.paused = True
        sys.stdout.write(text)
        sys.stdout.flush()
        self.streamed = True
        self.last_char = text[-1:]

    async def policy(self, ask: PermissionAsk) -> PermissionVerdict:
        if self.args.approve == "allow":
            return "allow"
        if self.args.approve == "deny":
            print(f"dsh ask: denied: {ask.describe()} (use --approve allow or ask)", file=sys.stderr)
            return "reject"
        self.spinner.paused = True
        self.spinner.clear()
        try:
            allowed = await anyio.to_thread.run_sync(
                _ask_terminal, f"dsh ask: the agent asks to run {ask.describe()}. Allow once? [y/N] ",
                abandon_on_cancel=True,
            )
        finally:
            self.spinner.paused = False
        return "allow" if allowed else "reject"

    def forward(self, chunk: bytes) -> None:
        self.spinner.clear()
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()

    # ------------------------------------------------------------------ cancel, kill, timeout

    async def kill(self) -> None:
        self.killed = True
        if self.client is not None:
            await self.client.shutdown(kill_now=True)

    async def first_cancel(self) -> None:
        if self.client is None or self.client.session_id is None:
            await self.kill()  # nothing to cancel yet: stop the agent
        else:
            await self.client.cancel()

    async def watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                self.cancels += 1
                self.spinner.clear()
                if signum == signal.SIGINT and self.cancels == 1:
                    print("dsh ask: cancelling (Ctrl-C again to kill)", file=sys.stderr)
                    await self.first_cancel()
                else:
                    print("dsh ask: killing the agent", file=sys.stderr)
                    await self.kill()

    async def watchdog(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        self.timed_out = True
        self.spinner.clear()
        print(f"dsh ask: timed out after {seconds:g} s; cancelling", file=sys.stderr)
        await self.first_cancel()
        await anyio.sleep(CANCEL_GRACE)
        await self.kill()

    # ------------------------------------------------------------------ the run

    async def run(self) -> int:
        result: PromptResult | None = None
        error: str | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.watch_signals)
            await anyio.sleep(0)  # the signal receiver is installed before anything is spawned
            tg.start_soon(self.spinner.run)
            if self.args.timeout is not None:
                tg.start_soon(self.watchdog, self.args.timeout)
            try:
                result = await self._prompt()
            except AcpClientError as exc:
                error = str(exc)
            finally:
                tg.cancel_scope.cancel()
        self.spinner.clear()
        return self._report(result, error)

    async def _prompt(self) -> PromptResult:
        async with open_client(
            self.argv,
            cwd=self.cwd,
            env=dict(os.environ),
            on_permission=self.policy,
            on_stderr=self.forward if self.args.verbose else None,
        ) as client:
            self.client = client
            if self.args.resume:
                await client.resume(self.args.resume)
            else:
                await client.start()
            return await client.prompt(self.args.task, on_text=self.on_text)

    def _report(self, result: PromptResult | None, error: str | None) -> int:
        """Print the ending (the JSON object, or the missing newline) and return the exit status."""
        client = self.client
        session_id = client.session_id if client is not None else None
        text = result.text if result is not None else (client.text if client is not None else "")
        stop = result.stop_reason if result is not None else "error"
        if result is not None and result.error:
            error = result.error
        if self.killed or self.timed_out:
            stop = "cancelled"
            error = None
        if self.args.json:
            obj: dict[str, Any] = {"stopReason": stop, "text": text, "sessionId": session_id}
            if self.timed_out:
                obj["timedOut"] = True
            if error:
                obj["error"] = error
            sys.stdout.write(json.dumps(obj) + "\n")
        elif self.streamed and self.last_char != "\n":
            sys.stdout.write("\n")
        sys.stdout.flush()
        return self._exit_status(stop, error)

    def _exit_status(self, stop: str, error: str | None) -> int:
        if self.timed_out:
            return EXIT_TIMEOUT
        if stop == "cancelled":
            return EXIT_CANCELLED
        if error is not None:
            print(f"dsh ask: {error}", file=sys.stderr)
            return EXIT_FAILED
        if stop == "end_turn":
            return EXIT_OK
        print(f"dsh ask: the agent stopped with {stop!r}", file=sys.stderr)
        return EXIT_OTHER_STOP
