"""The real-stdio ACP harness under ``dsh_testing`` and ``dsh_testing.scenarios``: spawn
``dsh run`` as a subprocess, drive it with the official ACP SDK client, record every stdout byte,
check each frame against ACP's vendored schema, normalise transcripts; and an in-process
``memory_host``. Plain functions and classes, no pytest hooks: the pytest plugin
(``dsh_testing``) and the scenario runner (``dsh_testing.scenarios``) both build on it, so
neither imports the other back.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import aclosing, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import anyio

import dsh_core

REPO = Path(dsh_core.__file__).resolve().parent.parent  # a source checkout of dsh (its tests/examples)
TEST_EXAMPLES = REPO / "tests" / "examples"  # dsh's test-only examples: a spawned dsh's default search path
# the env for a spawned dsh that finds the examples dsh ships (acp-editor, …) instead of the test-only ones
SHIPPED_EXAMPLES = {"DSH_EXAMPLES_PATH": str(REPO / "examples")}


def acp_schema_file() -> Any:
    """The vendored ACP v1 schema (v1.21.0), shipped as package data: ``dsh_testing/_vendor/acp/``
    holds it with its upstream LICENSE and SOURCE.md (commit, release, sha256)."""
    from importlib.resources import files

    return files("dsh_testing").joinpath("_vendor", "acp", "schema.json")


@cache
def acp_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(acp_schema_file().read_text(encoding="utf-8"))
    return schema


# The params of the methods an agent sends, each against its own definition. The schema's own
# request and notification unions end in extension branches (ExtNotification, ExtMethodRequest)
# that accept any params, so without this a malformed session/update would validate.
METHOD_PARAMS = {
    "session/update": "SessionNotification",
    "session/request_permission": "RequestPermissionRequest",
    "elicitation/create": "CreateElicitationRequest",
    "fs/read_text_file": "ReadTextFileRequest",
    "fs/write_text_file": "WriteTextFileRequest",
}


@cache
def acp_validator() -> Any:
    """A jsonschema validator for any frame an agent may send (request, response, notification);
    a frame of a method in ``METHOD_PARAMS`` must also carry that method's params."""
    import jsonschema

    schema = acp_schema()
    by_method = [
        {"if": {"properties": {"method": {"const": method}}, "required": ["method"]},
         "then": {"properties": {"params": {"$ref": f"#/$defs/{name}"}}, "required": ["params"]}}
        for method, name in METHOD_PARAMS.items()
    ]
    wrapper = {
        "$schema": schema.get("$schema", "https://json-schema.org/draft/2020-12/schema"),
        "$defs": schema["$defs"],
        "anyOf": [
            {"$ref": "#/$defs/AgentRequest"},
            {"$ref": "#/$defs/AgentResponse"},
            {"$ref": "#/$defs/AgentNotification"},
        ],
        "allOf": by_method,
    }
    cls = jsonschema.validators.validator_for(wrapper)
    return cls(wrapper)


def check_frames(raw: bytes, *, client_fs: bool = False) -> list[dict[str, Any]]:
    """Every line must be a JSON-RPC 2.0 object that validates against ACP's schema; the agent
    never calls the client's terminal, nor its fs unless ``client_fs`` (acp-editor's buffers)."""
    frames = []
    for n, line in enumerate(raw.split(b"\n")):
        if not line:
            continue
        try:
            frame = json.loads(line)
        except ValueError:
            raise AssertionError(f"stdout line {n} is not JSON: {line[:200]!r}") from None
        assert isinstance(frame, dict) and frame.get("jsonrpc") == "2.0", f"line {n} is not JSON-RPC: {line[:200]!r}"
        method = frame.get("method", "")
        assert not method.startswith(("terminal/",) if client_fs else ("fs/", "terminal/")), (
            f"the agent called the client's {method} (ACP-12: tools run in the harness, docs/acp-contract.md)"
        )
        errors = sorted(acp_validator().iter_errors(frame), key=str)
        assert not errors, f"stdout line {n} violates ACP schema: {errors[0].message}\n{line[:500]!r}"
        frames.append(frame)
    assert raw == b"" or raw.endswith(b"\n"), "stdout ends in a partial frame"
    return frames


_UUIDISH = re.compile(r"\b[0-9a-f]{32}\b")


def normalize_transcript(frames: Iterable[dict[str, Any]], cwd: str | None = None) -> str:
    """One JSON line per frame; ids renumbered by first appearance (client and agent id
    spaces kept apart), session ids → {{sessionId}}, the cwd → {{cwd}}, each message id →
    {{messageId-N}} numbered by first appearance (chunks of one message keep one number), an
    update's ``updatedAt`` → {{updatedAt}}."""
    ids: dict[Any, int] = {}
    message_ids: dict[str, int] = {}
    out = []
    for f in frames:
        f = json.loads(json.dumps(f))
        if "id" in f and f["id"] is not None:
            key = ("agent" if "method" in f else "client", f["id"])
            f["id"] = ids.setdefault(key, len(ids) + 1)
        update = (f.get("params") or {}).get("update") if isinstance(f.get("params"), dict) else None
        if isinstance(update, dict) and isinstance(update.get("messageId"), str):
            n = message_ids.setdefault(update["messageId"], len(message_ids) + 1)
            update["messageId"] = f"{{{{messageId-{n}}}}}"
        if isinstance(update, dict) and isinstance(update.get("updatedAt"), str):  # session_info_update: wall clock
            update["updatedAt"] = "{{updatedAt}}"
        text = json.dumps(f, sort_keys=True)
        text = _UUIDISH.sub("{{sessionId}}", text)
        if cwd:
            text = text.replace(cwd, "{{cwd}}")
        out.append(text)
    return "\n".join(out) + "\n"


def memory_host(
    model: str | Path,
    *extra_plugins: object,
    plugins: tuple[str, ...] = ("scripted-model",),
    provider: str = "scripted",
    config: dict[str, dict[str, Any]] | None = None,
) -> Any:
    """An in-process host for tests: ``async with memory_host(script) as host: ...``."""
    from dsh_core.compose import Composition
    from dsh_core.host import make_plugin_manager, open_host

    pm = make_plugin_manager(trace=False)
    for i, plugin in enumerate(extra_plugins):
        pm.register(plugin, name=f"test-plugin-{i}")
    comp = Composition(name="test", path=Path("test/example.toml"), plugins=plugins, config=config or {})
    return open_host(comp, provider=provider, model=str(model), pm=pm)


async def prompt_once(host: Any, cwd: str | Path, script: str | Path, text: str = "go", *,
                      timeout: float = 30.0) -> tuple[Any, list[Any]]:
    """A new agent on ``host`` in ``cwd`` whose scripted model plays ``script``, one prompt
    (``text``) until the agent is idle (at most ``timeout`` s): the agent and every event it emitted."""
    from dsh_core.contracts import AgentSpec
    from dsh_core.types import TextBlock, UserMessage

    agent = host.create_agent(AgentSpec(cwd=str(cwd), provider="scripted", model=str(script)))
    seen: list[Any] = []
    agent.subscribe(lambda a, e: seen.append(e))
    agent.submit(UserMessage(id="u1", content=[TextBlock(text=text)]))
    with anyio.fail_after(timeout):
        await agent.wait_idle()
    return agent, seen


def streaming(host: Any, provider: str = "scripted", calls: int = 1, *, delta: bool = True) -> Any:
    """An ``anyio.Event`` set once ``calls`` model calls of ``host``'s ``provider`` have each
    yielded their first delta (``delta=False``: have each started, before any output): a test
    waits on it (under ``anyio.fail_after``) instead of sleeping and hoping the turns got that far
    before it cancels or disposes."""
    import anyio

    started = anyio.Event()
    seen = 0
    model = host.models[provider]
    original = model.stream

    def count() -> None:
        nonlocal seen
        seen += 1
        if seen >= calls:
            started.set()

    async def stream(request: Any) -> AsyncIterator[Any]:
        first = True
        if not delta:
            count()
        async with aclosing(original(request)) as deltas:
            async for item in deltas:
                if first and delta:
                    count()
                first = False
                yield item

    model.stream = stream
    return started


def minimal_env(**extra: str) -> dict[str, str]:
    """The small environment the official ACP Python SDK gives an agent it spawns (HOME, LOGNAME,
    PATH, SHELL, TERM, USER), plus the test's ``DSH_HOME`` and ``DSH_CONFIG_HOME`` (so a spawned
    ``dsh`` writes under the test's temporary directory, never the user's data dir, and finds no
    key the developer stored) and its keyring backend and skill roots, plus ``extra``."""
    env = {k: os.environ[k] for k in ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "DSH_HOME", "DSH_CONFIG_HOME",
                                      "PYTHON_KEYRING_BACKEND", "DSH_SKILLS_USER_ROOTS") if k in os.environ}
    # a coverage run (tox -e coverage) measures the dsh processes a test spawns, too
    env.update({k: v for k, v in os.environ.items() if k in ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG")})
    env.update(extra)
    return env


def session_log(home: Path, session_id: str) -> list[dict[str, Any]]:
    """The records of a session's JSONL log under ``home`` (a test's ``DSH_HOME``), header first."""
    return [json.loads(line) for line in (home / "sessions" / f"{session_id}.jsonl").read_text().splitlines()]


def live_processes(match: Callable[..., bool], *, comm: bool = False) -> list[int]:
    """Pids of the live (not zombie) processes of this machine whose argv (split at NULs) and
    working directory ``match`` accepts — seen from outside any sandbox or pid namespace, so a test
    can count what a command left behind: ``live_processes(lambda argv, cwd: argv[:2] == [b"sleep", b"317.5"])``.
    With ``comm=True`` ``match`` also gets the process's name (``/proc/<pid>/comm``): ``match(argv, cwd, comm)``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            extra = (Path(f"/proc/{entry}/comm").read_text().strip(),) if comm else ()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state not in ("Z", "X") and match(argv, cwd, *extra):
            found.append(int(entry))
    return found


@contextmanager
def added_and_sibling_dirs(tag: str) -> Iterator[tuple[Path, Path]]:
    """Two fresh directories side by side outside every writable root (under /var/tmp, not /tmp):
    one for a session's additional directories, one that is not added; removed on exit."""
    base = Path("/var/tmp") / f"dsh-{tag}-{secrets.token_hex(4)}"
    (base / "added").mkdir(parents=True)
    (base / "sibling").mkdir()
    try:
        yield (base / "added").resolve(), (base / "sibling").resolve()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def new_sleep_marker(base: int = 3000) -> str:
    """An argument for ``sleep`` that nobody else runs (``base`` to ``base + 1000`` seconds and a
    random fraction): a test starts ``sleep <marker>`` and counts what is left of it with ``sleepers``."""
    return f"{base + secrets.randbelow(1000)}.{secrets.randbelow(10**6)}"


def sleepers(marker: str) -> list[int]:
    """Live processes running ``sleep <marker>`` (however deep, whatever pid namespace)."""
    return live_processes(lambda argv, cwd: argv[:2] == [b"sleep", marker.encode()])


async def sleepers_gone(marker: str, within: float = 10.0) -> bool:
    """Whether every ``sleep <marker>`` is gone within ``within`` seconds (polled every 50 ms)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not sleepers(marker):
            return True
        await anyio.sleep(0.05)
    return False


async def until(predicate: Any, timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` holds (polled every 10 ms): what follows an answer, a session
    update the client reads a moment after the response, is waited for instead of slept on."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"waited {timeout:.0f} s in vain for {getattr(predicate, '__name__', predicate)}")
        await asyncio.sleep(0.01)


@dataclass
class Recorder:
    """An SDK ``Client`` that records updates and answers permission requests from a queue."""

    updates: list[tuple[str, Any]] = field(default_factory=list)
    permission_answers: list[Any] = field(default_factory=list)  # "allow-once" | "reject-once" | "cancelled" | Exception | "hang"
    permission_requests: list[Any] = field(default_factory=list)

    def text(self, session_id: str | None = None) -> list[str]:
        return [
            u.content.text
            for sid, u in self.updates
            if (session_id is None or sid == session_id) and getattr(getattr(u, "content", None), "type", "") == "text"
            and getattr(u, "session_update", "") != "agent_thought_chunk"
        ]

    # --- acp.interfaces.Client
    async def session_update(self, session_id: str, update: Any, **kw: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(self, options: Any, session_id: str, tool_call: Any, **kw: Any) -> Any:
        from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

        self.permission_requests.append((session_id, tool_call, options))
        answer = self.permission_answers.pop(0) if self.permission_answers else "cancelled"
        if isinstance(answer, BaseException):
            raise answer
        if answer == "hang":
            await asyncio.sleep(3600)
        if answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=answer))

    def on_connect(self, conn: Any) -> None:
        pass


@dataclass
class AcpRun:
    conn: Any
    proc: asyncio.subprocess.Process
    client: Recorder
    cwd: Path
    stdout: bytearray
    stderr: bytearray
    frames: list[dict[str, Any]] = field(default_factory=list)

    async def start(self) -> str:
        """initialize + session/new; returns the session id."""
        await self.conn.initialize(protocol_version=1)
        session_id: str = (await self.conn.new_session(cwd=str(self.cwd), mcp_servers=[])).session_id
        return session_id

    async def prompt_held_at_permission(self, text: str) -> tuple[str, asyncio.Task[Any]]:
        """A new session whose prompt ``text`` waits at a permission request the client never answers
        (the next answer is ``"hang"``): returns the session id and the prompt, still running."""
        from acp import text_block

        self.client.permission_answers.append("hang")
        session_id = await self.start()
        pending = asyncio.create_task(self.conn.prompt(session_id=session_id, prompt=[text_block(text)]))
        await until(lambda: self.client.permission_requests)
        return session_id, pending

    async def close_stdin(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return await asyncio.wait_for(self.proc.wait(), 10)


@asynccontextmanager
async def spawn_acp(
    script: Path | None,
    *,
    cwd: Path,
    example: str = "acp-agent",
    env: dict[str, str] | None = None,
    client: Recorder | None = None,
    check: bool = True,
    dsh: tuple[str, ...] = (),
    provider: str = "scripted",
    unstable: bool = False,
    client_fs: bool = False,
) -> AsyncIterator[AcpRun]:
    """Spawn ``dsh run`` and connect the official SDK client to it through a byte tap.

    ``script`` is the ``--model`` of ``provider`` (a scripted-model script by default; a recorded
    session log for ``provider="replay"``; a model id for ``deepseek``); None: the example's route.
    ``dsh`` is the command that runs dsh (default: this interpreter's ``-m dsh_core.cli``),
    e.g. ``("/venv/bin/dsh",)`` to drive another installation. ``unstable`` lets the SDK client
    take the protocol's unstable methods (``elicitation/create``). ``client_fs``: the client
    advertises ``fs.*`` and the agent may call it (acp-editor's buffers); without it any ``fs/*``
    call fails the run (ACP-12), as any ``terminal/*`` call always does."""
    from acp import connect_to_agent

    client = client or Recorder()
    args = ["run", "--example", example]
    if script is not None:
        args += ["--provider", provider, "--model", str(script)]
    full_env = minimal_env(**(env or {}))
    full_env.setdefault("DSH_EXAMPLES_PATH", str(TEST_EXAMPLES))
    proc = await asyncio.create_subprocess_exec(
        *(dsh or (sys.executable, "-m", "dsh_core.cli")),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(cwd),
        env=full_env,
        limit=256 * 1024 * 1024,
        start_new_session=True,
    )
    raw = bytearray()
    err = bytearray()
    tapped = asyncio.StreamReader(limit=256 * 1024 * 1024)

    async def tap() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(1 << 20):
            raw.extend(chunk)
            tapped.feed_data(chunk)
        tapped.feed_eof()

    async def drain_stderr() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(1 << 16):
            err.extend(chunk)

    tasks = [asyncio.create_task(tap()), asyncio.create_task(drain_stderr())]
    sdk_client: Any = client  # a Recorder answers what a run needs; the SDK answers the rest method-not-found
    conn = connect_to_agent(sdk_client, proc.stdin, tapped, use_unstable_protocol=unstable)
    run = AcpRun(conn=conn, proc=proc, client=client, cwd=cwd, stdout=raw, stderr=err)
    try:
        yield run
    finally:
        if proc.returncode is None:
            assert proc.stdin is not None
            try:
                proc.stdin.close()
                await asyncio.wait_for(proc.wait(), 10)
            except (TimeoutError, ProcessLookupError):
                proc.kill()
                await proc.wait()
        await asyncio.gather(*tasks, return_exceptions=True)
        with suppress(Exception):
            await conn.close()
        if check:
            run.frames = check_frames(bytes(raw), client_fs=client_fs)
