"""``dsh batch TASKS.jsonl --out RESULTS.jsonl [--report REPORT.html]``: argument parsing and the run;
``dsh batch report RESULTS.jsonl -o REPORT.html``: the page of a results file (``report.py``), nothing run.

Exit status: 0 when every task of the list is ``ok`` in --out (this run or an earlier one);
1 when some task there is not ``ok`` or some task line was invalid; 2 for bad usage; 130 when interrupted (Ctrl-C or
SIGTERM; re-run the same command to finish).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

DESCRIPTION = (
    "Run every task of TASKS.jsonl (one JSON object per line: id, prompt, and optionally cwd, example, "
    "provider, model, timeout_s, approve) in a fresh ACP session of a pooled `dsh run --example …` agent, "
    "and append one result line per task to --out. Re-running the same command skips the ids already in "
    "--out (and reruns failures with --retry-failed). Ctrl-C cancels the tasks in flight (recorded "
    "`interrupted`, rerun next time) and exits 130. --ray runs the pool as Ray actors "
    "(pip install 'dsh-batch[ray]'). Keyless demo: dsh batch tasks.jsonl --out results.jsonl "
    "--provider scripted --model examples/acp-agent/demo.json. --report report.html writes a page of the batch "
    "(with report.json and report.csv beside it); `dsh batch report RESULTS.jsonl -o report.html` writes it again "
    "from a results file, without running anything"
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number")
    return value


def setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("tasks", metavar="TASKS.jsonl", help="the task list, one JSON object per line (or `report`)")
    p.add_argument("results", nargs="?", metavar="RESULTS.jsonl",
                   help="after `report`: the results file to write a report of (then --out is the page)")
    p.add_argument("--out", "-o", metavar="RESULTS.jsonl", help="results file (appended; resumable); required")
    p.add_argument(
        "--report", metavar="REPORT.html",
        help="at the end, write a page of the batch there, with REPORT.json and REPORT.csv beside it",
    )
    p.add_argument("--concurrency", "-j", type=_positive_int, default=4, metavar="N", help="tasks in flight at once (default 4)")
    p.add_argument(
        "--sessions-per-agent", type=_positive_int, default=4, metavar="M",
        help="concurrent sessions per agent process (default 4)",
    )
    p.add_argument(
        "--recycle-after", type=_positive_int, default=250, metavar="K",
        help="replace an agent process after K sessions when it cannot close sessions (default 250)",
    )
    p.add_argument(
        "--retries", type=_non_negative_int, default=2, metavar="R",
        help="rerun a task whose agent process crashed or could not start, on a fresh process, up to R times (default 2)",
    )
    p.add_argument("--retry-failed", action="store_true", help="also rerun the tasks recorded `failed` in --out")
    p.add_argument(
        "--example", "-e", default="acp-agent",
        help="default example to run as the agent (default: acp-agent); for `report`, the example whose providers "
             "price result lines that have no cost recorded",
    )
    p.add_argument("--provider", help="default model provider (env DSH_PROVIDER)")
    p.add_argument("--model", help="default model; for scripted: a script path")
    p.add_argument("--cwd", help="default session cwd; a task's relative cwd is relative to it (default: here)")
    p.add_argument("--timeout", type=_positive_float, metavar="S", help="default per-task timeout in seconds (then cancelled)")
    p.add_argument(
        "--approve", choices=("deny", "allow"), default="deny",
        help="default answer to the agents' permission requests (default: deny)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout at the end")
    p.add_argument(
        "--progress-interval", type=_positive_float, default=10.0, metavar="S",
        help="seconds between progress lines when stderr is not a terminal (default 10)",
    )
    p.add_argument(
        "--ray", nargs="?", const="local", metavar="ADDRESS",
        help="run on Ray: `auto`, `ray://host:port`, host:port, or (no value) a new local instance",
    )
    p.add_argument("--ray-actors", type=_positive_int, metavar="A", help="Ray actors (default: one per alive node)")
    p.add_argument("--verbose", "-v", action="store_true", help="forward the agents' stderr")


def _usage_error(message: str) -> int:
    print(f"dsh batch: {message}", file=sys.stderr)
    return EXIT_USAGE


def _path_here(value: str) -> str:
    """An example or model that names a file or directory where `dsh batch` runs, made absolute:
    a Ray actor (or any agent) elsewhere must find the same one. Names stay names."""
    return os.path.abspath(value) if os.path.exists(value) else value


def _here(task: Any) -> Any:
    """``task`` with its own example and model resolved like the command line's (``_path_here``)."""
    import msgspec

    return msgspec.structs.replace(task, example=task.example and _path_here(task.example),
                                   model=task.model and _path_here(task.model))


def _check_report_path(path: str, results: str) -> str | None:
    if os.path.splitext(path)[1].lower() in (".json", ".csv"):
        return f"{path}: the report is a page; its .json and .csv are written beside it"
    stem = os.path.splitext(os.path.abspath(path))[0]
    if os.path.abspath(results) in (os.path.abspath(path), stem + ".json", stem + ".csv"):
        return f"{path}: the report (or its .json/.csv) would overwrite the results file {results}"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{path}: no such directory {parent}"
    return None


def write_report(results_path: str, result_list: list, *, html: str, prompts: dict[str, str] | None, example: str) -> int:
    from . import report

    data = report.build(result_list, prompts=prompts, example=example)
    try:
        paths = report.write(data, html, source=results_path)
    except OSError as exc:
        print(f"dsh batch: --report {html}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"dsh batch: report: {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return EXIT_OK


def run_report(args: argparse.Namespace) -> int:
    """``dsh batch report RESULTS.jsonl -o REPORT.html``: the page of a results file, nothing run."""
    from .records import read_results

    if not args.out:
        return _usage_error("report: give the page to write with -o REPORT.html")
    if args.report:
        return _usage_error("report: the page is -o REPORT.html (--report is for a run)")
    if (problem := _check_report_path(args.out, args.results)) is not None:
        return _usage_error(problem)
    try:
        result_list, dropped = read_results(args.results)
    except OSError as exc:
        return _usage_error(f"{args.results}: {exc.strerror or exc}")
    for line, reason in dropped:
        print(f"dsh batch: {args.results}:{line}: {reason}", file=sys.stderr)
    return write_report(args.results, result_list, html=args.out, prompts=None, example=_path_here(args.example))


def run(args: argparse.Namespace) -> int:
    import anyio

    from .records import ResultsLocked, load_tasks, open_results
    from .runner import Defaults

    if args.tasks == "report" and args.results is not None:
        return run_report(args)
    if args.results is not None:
        return _usage_error(f"unexpected argument {args.results!r} (a report of a results file: dsh batch report RESULTS.jsonl -o REPORT.html)")
    if not args.out:
        return _usage_error("the results file is required: --out RESULTS.jsonl")
    if args.report and (problem := _check_report_path(args.report, args.out)) is not None:
        return _usage_error(problem)
    if os.path.isdir(args.tasks):
        return _usage_error(f"{args.tasks} is a directory; give the tasks file (JSON lines: {{\"id\": …, \"prompt\": …}})")
    if not os.path.isfile(args.tasks):
        return _usage_error(f"{args.tasks}: no such file")
    cwd = os.path.abspath(args.cwd or os.getcwd())
    if not os.path.isdir(cwd):
        return _usage_error(f"--cwd {args.cwd!r} is not a directory")
    try:
        task_list = load_tasks(args.tasks)
    except OSError as exc:
        return _usage_error(f"{args.tasks}: {exc.strerror or exc}")
    for line, reason in task_list.invalid:
        print(f"dsh batch: {args.tasks}:{line}: invalid task, skipped: {reason}", file=sys.stderr)
    rerun = {"interrupted", "failed"} if args.retry_failed else {"interrupted"}
    try:
        results = open_results(args.out, rerun=rerun)
    except ResultsLocked as exc:
        return _usage_error(str(exc))
    except OSError as exc:
        return _usage_error(f"--out {args.out}: {exc.strerror or exc}")
    for line, reason in results.dropped_lines:
        print(f"dsh batch: {args.out}:{line}: {reason}", file=sys.stderr)
    try:
        todo = [_here(t) for t in task_list.tasks if t.id not in results.kept]
        skipped = len(task_list.tasks) - len(todo)
        defaults = Defaults(
            example=_path_here(args.example), provider=args.provider, model=args.model and _path_here(args.model), cwd=cwd,
            timeout_s=args.timeout, approve=args.approve,
        )
        ids = [t.id for t in task_list.tasks]
        status = anyio.run(_main, args, todo, skipped, len(task_list.invalid), results, defaults, ids)
        if args.report:
            listed = [results.kept[i] for i in ids if i in results.kept]
            prompts = {t.id: t.prompt for t in task_list.tasks}
            if write_report(str(args.out), listed, html=args.report, prompts=prompts, example=defaults.example) != EXIT_OK:
                status = status or EXIT_FAILED
        return status
    finally:
        results.close()


async def _main(args: argparse.Namespace, todo: list, skipped: int, invalid: int, results, defaults, ids: list[str]) -> int:
    import anyio

    from . import progress as prog
    from .engine import Executor, Stats, drive

    stats = Stats(total=len(todo), skipped=skipped)
    if sys.stderr.isatty():
        listener: prog.LiveBar | prog.PlainLines = prog.LiveBar()
    else:
        listener = prog.PlainLines(args.progress_interval)
    engine = "local"
    if args.ray is not None:
        try:
            from .ray_engine import RayExecutor
        except ImportError as exc:
            print(f"dsh batch: --ray needs Ray: pip install 'dsh-batch[ray]' ({exc})", file=sys.stderr)
            return EXIT_USAGE
        executor_cm: contextlib.AbstractAsyncContextManager[Executor] = RayExecutor(
            args.ray,
            defaults,
            concurrency=args.concurrency,
            sessions_per_agent=args.sessions_per_agent,
            recycle_after=args.recycle_after,
            actors=args.ray_actors,
            verbose=args.verbose,
            note=listener.note,
        )
        engine = f"ray {args.ray}"
    else:
        from .runner import Runner

        executor_cm = Runner(
            defaults, sessions_per_agent=args.sessions_per_agent, recycle_after=args.recycle_after, verbose=args.verbose
        )
    if skipped:
        listener.note(f"{skipped} task(s) already in {args.out}: skipped")
    listener.start(stats)
    try:
        async with executor_cm as executor, anyio.create_task_group() as tg:
            tg.start_soon(listener.tick, stats)
            await drive(todo, executor, results, stats, listener, concurrency=args.concurrency, retries=args.retries)
            tg.cancel_scope.cancel()
    finally:
        listener.stop(stats)
    # the state of the whole list in --out, this run and earlier ones together
    state = {"ok": 0, "failed": 0, "interrupted": 0, "missing": 0}
    for task_id in ids:
        found = results.kept.get(task_id)
        state[found.status if found is not None else "missing"] += 1
    if stats.interrupted_by is not None:
        status = EXIT_INTERRUPTED
    elif stats.cannot_start is not None:
        status = EXIT_USAGE  # as `dsh run` itself exits on that error
    elif state["ok"] != len(ids) or invalid:
        status = EXIT_FAILED
    else:
        status = EXIT_OK
    data = prog.summary(stats, out=str(args.out), engine=engine, invalid=invalid, status=status)
    data["results"] = state  # the whole list as --out now holds it
    prog.print_table(data)
    if args.json:
        sys.stdout.write(json.dumps(data) + "\n")
        sys.stdout.flush()
    return status
