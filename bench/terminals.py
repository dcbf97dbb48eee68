"""Terminals, through a real host's tool path, beside bash measured in the same run and sandbox:

1. ``terminal_send {text: "true"}`` on an open terminal (a real PTY, the shell already running:
   the write, the shell's prompt marker, the readiness check; ``true`` is a builtin there) against
   a one-shot ``bash {command: "true"}`` (a fork and an exec through the session's warm command
   server), and ``terminal_send {text: "/bin/true"}`` (the shell forks and execs a program).
2. ``terminal_open`` (a confined shell started and at its first prompt) beside them, once per run.
3. The persistent ``bash {command: "true"}`` (a terminal under the hood) beside the one-shot one.

    python bench/terminals.py [--repeat 30] [--mechanism auto|bwrap|landlock]
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from _common import Caller, bench_host, run_main


async def main(repeat: int, mechanism: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        plugins = ("scripted-model", "sandbox-tools", "jobs", "terminal")
        config = {"sandbox-tools": {"mechanism": mechanism}, "terminal": {"max-terminals": repeat + 5}}
        persistent = {"sandbox-tools": {"mechanism": mechanism, "bash": False},
                      "terminal": {"tools": "persistent-bash"}}
        async with bench_host(work, plugins, config) as (_, agent), \
                bench_host(work, plugins, persistent) as (_, pagent):
            session = Caller(agent)

            async def call(who, name: str, args: dict) -> float:
                return (await session.call(name, args, who))[0]

            await call(agent, "bash", {"description": "Run the command", "command": "true"})  # the session's command server starts once
            await call(agent, "terminal_open", {"type": "shell"})
            await call(pagent, "bash", {"command": "true"})  # the persistent shell starts once
            one_shot, sent, forked, kept, opened = [], [], [], [], []
            for _ in range(repeat):
                one_shot.append(await call(agent, "bash", {"description": "Run the command", "command": "true"}))
                sent.append(await call(agent, "terminal_send", {"sessionId": "pty-1", "text": "true"}))
                forked.append(await call(agent, "terminal_send", {"sessionId": "pty-1", "text": "/bin/true"}))
                kept.append(await call(pagent, "bash", {"command": "true"}))
            for i in range(min(repeat, 10)):
                opened.append(await call(agent, "terminal_open", {"type": "shell"}))
                await call(agent, "terminal_close", {"sessionId": f"pty-{i + 2}"})

    med = statistics.median
    print(f"terminal_send of `true` ({repeat} runs, {mechanism}): median {med(sent):.2f} ms, max {max(sent):.2f} ms; "
          f"bash `true`: median {med(one_shot):.2f} ms, max {max(one_shot):.2f} ms  ({med(sent) / med(one_shot):.2f}x)")
    print(f"terminal_send of `/bin/true` (the shell forks and execs, as bash's call does): median "
          f"{med(forked):.2f} ms ({med(forked) / med(one_shot):.2f}x bash `true`)")
    print(f"persistent bash `true`: median {med(kept):.2f} ms ({med(kept) / med(one_shot):.2f}x one-shot bash)")
    print(f"terminal_open (confined shell to its first prompt, {len(opened)} runs): median {med(opened):.2f} ms")


if __name__ == "__main__":
    run_main(main, __doc__, repeat=30)
