"""More keyless snapshot scenarios (issue 16), written with the inline harness of tests/test_snapshots.py.

Each body boots `dsh run` over real stdio, drives it with the official SDK client and asserts what
the scenario is about. The model is the scripted one, except where the provider's own behaviour is
the point (empty answer, retry, credentials): there it is deepseek-model against the loopback fake
DeepSeek server of plugins/deepseek-model/tests. Every scenario here has since been converted
(tests/snapshot_convert.py, through ``conversion`` below) to a scenario directory under
snapshots/acp-agent/ that replays its recording keyless (dsh_testing.scenarios, collected from
snapshots/); a scenario whose directory has an input.json is no longer run here. The table and the
bodies stay as the conversion's source (re-running it re-records through the same bodies and
checks); the tests at the end check each body's point on the committed recordings and transcripts,
so a careless refresh cannot bless a regression.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError, text_block
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism
from test_snapshots import SNAPSHOTS, normalize_log, normalize_stdout

from dsh_testing import Recorder, make_png
from dsh_testing.scenarios import load_scenario

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "plugins" / "deepseek-model" / "tests"))
from fake_deepseek import FakeDeepSeek, Fault, Turn  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.snapshot_scenario]


def _then(*steps: dict, say: str = "DONE") -> list[dict]:
    return [*steps, {"text": say}]


def _read(path: str, **extra: Any) -> dict:
    return {"tool": "read", "args": {"file_path": path, **extra}}


def _bash(command: str) -> dict:
    return {"tool": "bash", "args": {"description": "Run the command", "command": command}}


# --------------------------------------------------------------------------------------- scripts

FS_SCRIPT = {
    "capabilities": {"image_input": True},
    "rules": [
        {"when": "^delete", "steps": _then(
            _read("deleted.txt"), _bash("rm deleted.txt"), _read("deleted.txt"),
            {"tool": "write", "args": {"file_path": "deleted.txt", "content": "fresh\n"}})},
        {"when": "^escalate", "steps": _then(
            {"tool": "write", "args": {"file_path": "escalated.md", "content": "escalated\n",
                                       "sandbox_permissions": "workspace-write",
                                       "justification": "the user asked to escalate this write"}})},
        {"when": "^window", "steps": _then(_read("big.txt", offset=5, limit=4))},
        {"when": "^overwrite", "steps": _then(
            _read("data.txt"), {"tool": "write", "args": {"file_path": "data.txt", "content": "replaced\n"}})},
        {"when": "^glob", "steps": _then({"tool": "glob", "args": {"pattern": "**/*", "path": "tree"}},
                                         say="GLOB_SAMPLED")},
        {"when": "^parallel", "steps": _then({"tools": [{"name": "read", "args": {"file_path": "a.txt"}},
                                                        {"name": "read", "args": {"file_path": "b.txt"}}]})},
        {"when": "^wide", "steps": _then({"tool": "read_image", "args": {"file_path": "wide.png"}}, say="WIDE")},
        {"when": "^root", "steps": _then(
            {"tool": "write", "args": {"file_path": "session-root.txt", "content": "session root\n"}},
            _bash("pwd && touch made-by-bash"))},
        {"when": "^append", "steps": _then(_bash("echo WORLD >> greeting.txt"), _bash("cat greeting.txt"))},
        # read-only: each call escalates once, so it runs one-shot through the Landlock launcher,
        # which prints the partial-enforcement notice before it execs the command
        {"when": "^landlock", "steps": _then(*[
            {"tool": "bash", "args": {"description": "Run the command", "command": command, "sandbox_permissions": "workspace-write",
                                      "justification": "pin the partial Landlock path"}}
            for command in ("false", "echo out; echo err >&2; exit 125")], say="CHILD_EXIT_PRESERVED")},
        # max tokens while the second of two calls streams: neither runs; the next prompt goes on
        {"when": "^cut", "steps": [{"text": "Reading both. ", "finish": "length",
                                    "tools": [{"name": "read", "args": {"file_path": "a.txt"}},
                                              {"name": "read", "args": {"file_path": "b.txt"}}]}]},
        {"when": "^continue", "steps": _then(_read("b.txt"), say="b says: {tool_result}")},
    ],
}

# Parent and children play the same script (a child runs `dsh run` on the parent's route).
_CHILD = "subagent_acp"
SUB_SCRIPT = {
    "rules": [
        {"when": "^delegate one", "steps": _then({"tool": _CHILD, "args": {"task": "child: say PONG"}},
                                                 say="child said: {tool_result}")},
        {"when": "^delegate in turn", "steps": [
            {"tool": _CHILD, "args": {"task": "child: first"}},
            {"text": "first: {tool_result}\n", "tool": _CHILD, "args": {"task": "child: second"}},
            {"text": "second: {tool_result}"}]},
        {"when": "^delegate at once", "steps": _then(
            {"tools": [{"name": _CHILD, "args": {"task": "child: left"}},
                       {"name": _CHILD, "args": {"task": "child: right"}}]}, say="both back")},
        {"when": "^delegate cut", "steps": _then({"tool": _CHILD, "args": {"task": "child: long story"}},
                                                 say="kept: {tool_result}")},
        {"when": "^child: (left|right)", "steps": [{"text": "CHILD ANSWER to <{prompt}>", "delay_ms": 3000}]},
        {"when": "^child: long story", "steps": [{"text": "Once upon a time there was", "finish": "length"}]},
        {"when": "^child: ", "steps": [{"text": "CHILD ANSWER to <{prompt}>"}]},
        # depth: every level has the tool; the third level is refused
        {"when": "^nest (\\d)", "steps": [
            {"tool": _CHILD, "args": {"task": "{prompt} deeper"}},
            {"text": "level <{prompt}> got: {tool_result}"}]},
    ],
}



# ------------------------------------------------------------------------------------- scenarios


@dataclass
class Run:
    """What a scenario body gets: the SDK connection, the directories, and the session ids."""

    acp: Any
    home: Path
    cwd: Path
    sids: list[str] = field(default_factory=list)
    fake: FakeDeepSeek | None = None

    async def start(self, cwd: Path | None = None) -> str:
        await self.acp.conn.initialize(protocol_version=1)
        sid = (await self.acp.conn.new_session(cwd=str(cwd or self.cwd), mcp_servers=[])).session_id
        self.sids.append(sid)
        return sid

    async def prompt(self, text: str, sid: str | None = None) -> str:
        result = await self.acp.conn.prompt(session_id=sid or self.sids[0], prompt=[text_block(text)])
        return result.stop_reason

    def log(self, n: int = 0) -> list[dict]:
        return [json.loads(line) for line in (self.home / "sessions" / f"{self.sids[n]}.jsonl").read_text().splitlines()]

    def results(self, n: int = 0) -> list[str]:
        return ["".join(b.get("text", "") for b in e["result"]["content"])
                for e in self.log(n) if e["type"] == "tool/result"]


Body = Callable[[Run], Awaitable[None]]


@dataclass
class Scenario:
    body: Body
    script: dict | None = None  # scripted model; None: deepseek-model against the fake
    example: str = "acp-agent"
    env: dict[str, str] = field(default_factory=dict)
    answers: list[str] = field(default_factory=list)  # permission answers, in order
    confined: bool = False  # once per sandbox mechanism, against the same files
    fake_turns: list[Any] = field(default_factory=list)
    key: str | None = "fake"  # DEEPSEEK_API_KEY for deepseek scenarios: "fake", None, or a literal


def one_prompt(text: str, setup: Callable[[Path], None] | None = None, *, stop: str = "end_turn",
               check: Callable[[Run], None] | None = None) -> Body:
    async def body(run: Run) -> None:
        if setup:
            setup(run.cwd)
        await run.start()
        assert await run.prompt(text) == stop
        if check:
            check(run)

    return body


def _files(**files: str | bytes) -> Callable[[Path], None]:
    def setup(cwd: Path) -> None:
        for name, content in files.items():
            path = cwd / name.replace("__", "/")
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)

    return setup


def _check_delete(run: Run) -> None:
    assert (run.cwd / "deleted.txt").read_text() == "fresh\n"
    first, _, again, write = run.results()
    assert "old contents" in first and "does not exist" in again and write.endswith("\nCreated file\n</content>")


def _check_escalation(run: Run) -> None:
    assert (run.cwd / "escalated.md").read_text() == "escalated\n"
    assert len(run.acp.client.permission_requests) == 1


def _check_window(run: Run) -> None:
    (result,) = run.results()
    assert "line 5\n" in result and "line 8\n" in result and "line 4\n" not in result and "line 9\n" not in result


def _check_overwrite(run: Run) -> None:
    assert (run.cwd / "data.txt").read_text() == "replaced\n"


def _glob_tree(cwd: Path) -> None:
    for name, count in (("archive", 1100), ("docs", 3), ("src", 2)):
        (cwd / "tree" / name).mkdir(parents=True)
        for i in range(count):
            (cwd / "tree" / name / f"f{i:04d}.txt").write_text("x")
    (cwd / "tree" / "README.md").write_text("x")


def _check_glob(run: Run) -> None:
    (result,) = run.results()
    lines = result.splitlines()
    assert lines[-1].startswith("[more than 1000 matches: a sample across the top-level entries")
    # the three small entries are complete; the big one filled the rest of the cap
    for path in ("tree/docs/f0002.txt", "tree/src/f0001.txt", "tree/README.md", "tree/docs", "tree/src"):
        assert path in lines
    assert len(lines) == 1001


def _check_parallel(run: Run) -> None:
    (call,) = [e for e in run.log() if e["type"] == "assistant/message" and e.get("finish") == "tool-calls"]
    assert [b["name"] for b in call["message"]["content"] if b["type"] == "tool-call"] == ["read", "read"]
    assert [r.splitlines()[0].split("\t")[-1] for r in run.results()] == ["contents of a", "contents of b"]


WIDE = make_png(2001, 1, (10, 200, 30))


def _check_wide(run: Run) -> None:
    digest = hashlib.sha256(WIDE).hexdigest()
    stored = run.home / "attachments" / "objects" / "sha256" / digest[:2] / digest
    assert stored.read_bytes() == WIDE  # byte-identical: not resized, not re-encoded
    assert digest in json.dumps(run.log())


async def sc_session_root(run: Run) -> None:
    root = run.cwd / "session-root"
    root.mkdir()
    await run.start(cwd=root)
    assert await run.prompt("root: write where the session lives") == "end_turn"
    assert (root / "session-root.txt").read_text() == "session root\n" and (root / "made-by-bash").exists()
    assert not (run.cwd / "session-root.txt").exists() and not (run.cwd / "made-by-bash").exists()
    assert run.results()[1].splitlines()[0] == str(root.resolve())


def _check_append(run: Run) -> None:
    assert (run.cwd / "greeting.txt").read_text() == "HELLO\nWORLD\n"


def _check_landlock(run: Run) -> None:
    # Failed commands stay plain failures: the runner's notice is neither a runner failure
    # (SANDBOX_UNAVAILABLE, even with the launcher's own exit code 125) nor part of the output.
    assert run.results() == ["(no output)\n[exit code 1]", "out\nerr\n[exit code 125]"]
    assert "SANDBOX_UNAVAILABLE" not in json.dumps(run.log()) and "landlock-run" not in json.dumps(run.log())
    assert len(run.acp.client.permission_requests) == 2


async def sc_cut_tool_call(run: Run) -> None:
    _files(**{"a.txt": "contents of a\n", "b.txt": "contents of b\n"})(run.cwd)
    await run.start()
    assert await run.prompt("cut me off mid call") == "end_turn"
    assert run.results() == []  # neither the whole first call nor the half-streamed second one ran
    assert await run.prompt("continue") == "end_turn"
    log = run.log()
    cut = next(e for e in log if e["type"] == "assistant/message")
    assert cut["finish"] == "max-tokens" and [b["type"] for b in cut["message"]["content"]] == ["text"]
    assert [e["reason"] for e in log if e["type"] == "turn/end"] == ["max-tokens", "completed"]
    assert len(run.results()) == 1 and "contents of b" in run.results()[0]
    assert run.acp.client.text() == ["Reading both. ", "b says:      1\tcontents of b"]


# -- subagents


def _child_logs(run: Run) -> list[list[dict]]:
    out = []
    for path in (run.home / "sessions").glob("*.jsonl"):
        if path.stem not in run.sids:
            out.append([json.loads(line) for line in path.read_text().splitlines()])
    return out


def _sub_check(children: int, *needles: str) -> Callable[[Run], None]:
    def check(run: Run) -> None:
        assert len(_child_logs(run)) == children
        results = run.results()
        for needle in needles:
            assert any(needle in r for r in results), (needle, results)

    return check


def _check_cut_child(run: Run) -> None:
    (child,) = _child_logs(run)
    assert [e["reason"] for e in child if e["type"] == "turn/end"] == ["max-tokens"]
    # The parent keeps the child's partial output. Its status says "completed": a dsh child's ACP
    # front door settles a max-tokens turn as end_turn (docs/acp-contract.md, ACP-7), so over ACP
    # the parent cannot tell the two apart.
    assert run.results() == ["[subagent completed]\nOnce upon a time there was"]


async def sc_parallel_children(run: Run) -> None:
    await run.start()
    assert await run.prompt("delegate at once: two children") == "end_turn"
    left, right = run.results()
    assert left == "[subagent completed]\nCHILD ANSWER to <child: left>"
    assert right == "[subagent completed]\nCHILD ANSWER to <child: right>"
    # both children were alive at once: each one's session started before the other's ended
    spans = sorted((c[0]["createdAt"], max(e.get("time", 0) for e in c)) for c in _child_logs(run))
    assert len(spans) == 2 and spans[1][0] < spans[0][1]


async def sc_depth_two(run: Run) -> None:
    await run.start()
    assert await run.prompt("nest 1") == "end_turn"
    (result,) = run.results()
    assert "subagent depth limit reached (this agent is at depth 2, the limit is 2)" in result
    assert len(_child_logs(run)) == 2  # depths 1 and 2; nobody at depth 3


# -- deepseek-model against the fake


async def sc_deepseek_turn(run: Run) -> None:
    await run.start()
    assert await run.prompt("say pong") == "end_turn"


async def sc_deepseek_fails(run: Run) -> None:
    await run.start()
    with pytest.raises(RequestError):
        await run.prompt("say pong")


def _retries(run: Run) -> list[dict]:
    return [e for e in run.log() if e["type"] == "llm/retry"]


async def sc_empty_retry(run: Run) -> None:
    await sc_deepseek_turn(run)
    (retry,) = _retries(run)
    assert retry["code"] == "EMPTY_RESPONSE" and len(run.fake.chat_requests) == 2
    assert run.acp.client.text() == ["Recovered."]


async def sc_provider_retry(run: Run) -> None:
    await sc_deepseek_turn(run)
    (retry,) = _retries(run)
    assert retry["code"] == "RATE_LIMIT" and len(run.fake.chat_requests) == 2
    assert run.acp.client.text() == ["RETRY_OK"]


def sc_credential(code: str) -> Body:
    async def body(run: Run) -> None:
        await sc_deepseek_fails(run)
        end = run.log()[-1]
        assert end["type"] == "turn/end" and end["code"] == code and not _retries(run)
        assert run.fake.chat_requests == []  # refused before anything was sent

    return body


SCENARIOS: dict[str, Scenario] = {
    "empty-response-retry": Scenario(sc_empty_retry, fake_turns=[Turn(content=""), Turn(content="Recovered.")]),
    "provider-retry": Scenario(sc_provider_retry, fake_turns=[Fault(429, "snapshot transient failure"),
                                                              Turn(content="RETRY_OK")]),
    "missing-credential": Scenario(sc_credential("MISSING_CREDENTIAL"), key=None),
    "invalid-credential": Scenario(sc_credential("INVALID_CREDENTIAL"), key="sk-pasted with a space"),
    "fs-delete-recreate": Scenario(one_prompt("delete and recreate deleted.txt",
                                              _files(**{"deleted.txt": "old contents\n"}), check=_check_delete),
                                   FS_SCRIPT),
    "fs-escalation-approved": Scenario(one_prompt("escalate the write", check=_check_escalation), FS_SCRIPT,
                                       env={"DSH_PERMISSION_MODE": "read-only"}, answers=["allow-once"]),
    "fs-read-window": Scenario(one_prompt("window of big.txt", _files(**{"big.txt": "".join(
        f"line {i}\n" for i in range(1, 21))}), check=_check_window), FS_SCRIPT),
    "fs-write-overwrite": Scenario(one_prompt("overwrite data.txt", _files(**{"data.txt": "original\n"}),
                                              check=_check_overwrite), FS_SCRIPT),
    "fs-glob-sampling": Scenario(one_prompt("glob the tree", _glob_tree, check=_check_glob), FS_SCRIPT),
    "parallel-tool-calls": Scenario(one_prompt("parallel reads", _files(**{"a.txt": "contents of a\n",
                                                                           "b.txt": "contents of b\n"}),
                                               check=_check_parallel), FS_SCRIPT),
    "read-image-dimension": Scenario(one_prompt("wide.png please", _files(**{"wide.png": WIDE}),
                                                check=_check_wide), FS_SCRIPT),
    "session-sandbox-root": Scenario(sc_session_root, FS_SCRIPT, confined=True),
    "workspace-edit": Scenario(one_prompt("append WORLD", _files(**{"greeting.txt": "HELLO\n"}),
                                          check=_check_append), FS_SCRIPT, confined=True),
    "partial-landlock-child-failure": Scenario(one_prompt("landlock: run false", check=_check_landlock), FS_SCRIPT,
                                               answers=["allow-once", "allow-once"],
                                               env={"DSH_PERMISSION_MODE": "read-only",
                                                    "DSH_SANDBOX_MECHANISM": "landlock",
                                                    "DSH_LANDLOCK_MAX_ABI": "2"}),
    "max-tokens-tool-call": Scenario(sc_cut_tool_call, FS_SCRIPT),
    "subagent-one": Scenario(one_prompt("delegate one", check=_sub_check(1, "CHILD ANSWER to <child: say PONG>")),
                             SUB_SCRIPT, example="acp-agent-subagent"),
    "subagent-sequential": Scenario(one_prompt("delegate in turn", check=_sub_check(
        2, "CHILD ANSWER to <child: first>", "CHILD ANSWER to <child: second>")), SUB_SCRIPT,
        example="acp-agent-subagent"),
    "subagent-parallel": Scenario(sc_parallel_children, SUB_SCRIPT, example="acp-agent-subagent"),
    "subagent-max-tokens-partial": Scenario(one_prompt("delegate cut", check=_check_cut_child), SUB_SCRIPT,
                                            example="acp-agent-subagent"),
    "subagent-depth-two-rejection": Scenario(sc_depth_two, SUB_SCRIPT, example="nest"),
}



# ------------------------------------------------------------------------------ conversion
# Every scenario above was converted (tests/snapshot_convert.py --module tests/test_snapshots_more.py
# NAME…) to a scenario directory that replays its recording (dsh_testing.scenarios, collected from
# snapshots/). The examples the bodies used to write per test are tests/examples/acp-deepseek-fast-retry,
# acp-deepseek-bad-config and subagent-nest now (each also mounts replay-model). The deepseek
# scenarios are recorded through a fresh loopback fake DeepSeek server, in DeepSeek's wire format;
# their replay needs neither the server nor a key.

STARTUP = "startup-activation-error"
EXAMPLE_NAMES = {"nest": "subagent-nest"}
FAKE_ABOUT = ("Recorded through the loopback fake DeepSeek server (plugins/deepseek-model/tests/fake_deepseek.py), "
              "which answered {turns}; a live API cannot be made to, so refresh keeps it current.")
CREDENTIAL_ABOUT = ("deepseek-model refuses the call before anything is sent; recorded through the loopback fake "
                    "DeepSeek server, which got no request. A live re-record changes nothing and sends nothing.")


def scenario_dir(name: str) -> Path:
    return SNAPSHOTS / name


@contextmanager
def _fake_route(sc: Scenario) -> Iterator[dict[str, Any]]:
    with FakeDeepSeek(keepalive_every_s=0.05) as fake:
        fake.push(*sc.fake_turns)
        env = {"DEEPSEEK_BASE_URL": fake.base_url}
        if sc.key == "fake":
            env["DEEPSEEK_API_KEY"] = fake.api_key
        yield {"provider": "deepseek", "model": "deepseek-flash", "env": env, "fake": fake}


@contextmanager
def _no_fake_route() -> Iterator[dict[str, Any]]:
    yield {"provider": "deepseek", "model": "deepseek-flash", "env": {}}


def conversion(name: str) -> dict[str, Any]:
    """How tests/snapshot_convert.py converts ``name`` (see its docstring)."""
    if name == STARTUP:
        async def no_client(acp: Any, sids: list[str]) -> None:  # the agent exits before anyone can talk to it
            await asyncio.wait_for(acp.proc.wait(), 60)
            assert acp.proc.returncode != 0 and bytes(acp.stdout) == b""

        return {"example": "acp-deepseek-bad-config", "body": no_client, "route": _no_fake_route, "recordable": True,
                "pinStderr": True, "about": "deepseek-model refuses its config at activation: no session, nothing on "
                                            "stdout, exit 2 and one plain line on stderr (stderr.expected.txt)."}
    sc = SCENARIOS[name]

    async def body(acp: Any, sids: list[str]) -> None:
        for answer in sc.answers:  # queued before the first request, as the inline harness's Recorder had them
            acp.client.permission_answers.append(answer)
        fake = acp.route.get("fake")
        await sc.body(Run(acp=acp, home=acp.home, cwd=acp.cwd, sids=sids, fake=fake))
        if fake is not None:
            assert fake.api_key not in bytes(acp.stderr).decode(errors="replace")

    spec: dict[str, Any] = {"example": EXAMPLE_NAMES.get(sc.example, sc.example), "body": body}
    env = dict(sc.env)
    if sc.script is None:
        spec["example"] = "acp-deepseek-fast-retry"
        spec["route"] = lambda: _fake_route(sc)
        if sc.key != "fake":
            env["DEEPSEEK_API_KEY"] = sc.key or ""  # "": no key (deepseek-model reads an empty one as none)
            spec["recordable"], spec["about"] = True, CREDENTIAL_ABOUT
        else:
            turns = ", then ".join(f"HTTP {t.status}" if isinstance(t, Fault) else repr(t.content) if t.content
                                   else "nothing" for t in sc.fake_turns)
            spec["about"] = FAKE_ABOUT.format(turns=turns)
    else:
        spec["script"] = sc.script
    if env:
        spec["env"] = env
    if env.get("DSH_PERMISSION_MODE") == "read-only":  # the system prompt states the policy and the cwd
        spec["header"] = "acp-agent-read-only"
    elif name == "session-sandbox-root":
        spec["header"] = "acp-agent-session-root"
    if sc.confined:
        spec["perMechanism"] = True
    if name in CHECK_FILES:
        spec["checkFiles"] = CHECK_FILES[name]
    return spec


# What the tools must have left in the workspace, checked at the end of every replay (the bodies'
# checks of files, which no log line can prove).
CHECK_FILES: dict[str, dict[str, Any]] = {
    "fs-delete-recreate": {"deleted.txt": "fresh\n"},
    "fs-escalation-approved": {"escalated.md": "escalated\n"},
    "fs-write-overwrite": {"data.txt": "replaced\n"},
    "session-sandbox-root": {"session-root/session-root.txt": "session root\n", "session-root/made-by-bash": True,
                             "session-root.txt": None, "made-by-bash": None},
    "workspace-edit": {"greeting.txt": "HELLO\nWORLD\n"},
}


def _converted(name: str) -> bool:
    return (scenario_dir(name) / "input.json").is_file()


# A scenario whose directory has an input.json runs by replay, no longer here.
CASES = [
    pytest.param(name, mechanism, id=f"{name}-{mechanism}" if mechanism else name)
    for name, sc in SCENARIOS.items() if not _converted(name)
    for mechanism in (MECHANISMS if sc.confined else (None,))
]


async def run_legacy_scenario(name, mechanism, acp_agent, scripted, snapshot):
    sc = SCENARIOS[name]
    env = {"DSH_PERMISSION_MODE": "workspace-write", **sc.env}
    if mechanism or "DSH_SANDBOX_MECHANISM" in sc.env:
        mechanism = mechanism or sc.env["DSH_SANDBOX_MECHANISM"]
        require_mechanism(mechanism)
        env["DSH_SANDBOX_MECHANISM"] = mechanism
    replacements: dict[str, str] = {str(REPO): "{{repo}}"}
    fake = None
    script = None
    example = sc.example
    if sc.script is None:
        fake = FakeDeepSeek(keepalive_every_s=0.05).start()
        fake.push(*sc.fake_turns)
        example = "acp-deepseek-fast-retry"  # tests/examples, as in the scenario's replay
        env["DEEPSEEK_BASE_URL"] = fake.base_url
        if sc.key is not None:
            env["DEEPSEEK_API_KEY"] = fake.api_key if sc.key == "fake" else sc.key
        replacements[fake.base_url] = "{{base_url}}"
    else:
        script = scripted(sc.script)
        replacements[str(script)] = "{{script}}"
        example = EXAMPLE_NAMES.get(example, example)
    client = Recorder(permission_answers=list(sc.answers))
    try:
        async with acp_agent(script, example=example, client=client, env=env) as acp:
            run = Run(acp=acp, home=acp_agent.home, cwd=acp.cwd, fake=fake)
            await sc.body(run)
    finally:
        if fake is not None:
            fake.stop()
    if fake is not None:
        assert fake.api_key not in bytes(acp.stderr).decode(errors="replace")
    replacements.update({str(acp_agent.home): "{{home}}", str(acp.cwd): "{{cwd}}"})
    snapshot.snapshot_dir = SNAPSHOTS / name
    snapshot.assert_match(normalize_stdout(acp.frames, run.sids, replacements), "stdout.jsonl")
    logs = [s for s in run.sids if (acp_agent.home / "sessions" / f"{s}.jsonl").exists()]
    snapshot.assert_match(normalize_log(acp_agent.home, logs, replacements) if logs else "", "session.jsonl")


if CASES:

    @pytest.mark.parametrize("name, mechanism", CASES)
    async def test_scenario(name, mechanism, acp_agent, scripted, snapshot):
        await run_legacy_scenario(name, mechanism, acp_agent, scripted, snapshot)


# ------------------------------------------------------------------ start-up activation error



def test_every_scenario_replays_from_its_directory():
    """The tables above are what the scenario directories were converted from; each runs by replay
    (snapshots/acp-agent/<name>/input.json; the start-up error pins its stderr there). A new entry
    needs `python tests/snapshot_convert.py --module tests/test_snapshots_more.py NAME`."""
    assert [name for name in [*SCENARIOS, STARTUP] if not _converted(name)] == []


# ---------------------------------------------------------------- what the converted scenarios prove
# A converted scenario's logs are what its replay must write, line for line, and its
# stdout.expected.jsonl the wire it must write; so a property of the committed files is a property
# of every passing replay. These are the bodies' run-time checks, made on those files. (What only a
# live run can show — how many requests the fake server got, that two children's processes
# overlapped in time — was checked by the bodies when the scenarios were recorded.)


def _logs(name: str) -> list[list[dict]]:
    """The committed logs of ``name``: the client's session first, then subagents by first prompt."""
    sc = load_scenario(scenario_dir(name))
    return [[json.loads(line) for line in p.read_text().splitlines()] for p in sc.logs()]


def _results(log: list[dict]) -> list[str]:
    return ["".join(b.get("text", "") for b in e["result"]["content"]) for e in log if e["type"] == "tool/result"]


def _wire(name: str) -> list[dict]:
    return [json.loads(line) for line in (scenario_dir(name) / "stdout.expected.jsonl").read_text().splitlines()
            if line.strip()]


def _chunks(name: str) -> list[str]:
    return [f["params"]["update"]["content"]["text"] for f in _wire(name)
            if f.get("method") == "session/update" and f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"]


def _permission_requests(name: str) -> int:
    return sum(f.get("method") == "session/request_permission" for f in _wire(name))


@pytest.mark.parametrize("name, code, text", [("empty-response-retry", "EMPTY_RESPONSE", "Recovered."),
                                              ("provider-retry", "RATE_LIMIT", "RETRY_OK")])
def test_retry_scenarios_retry_once_then_answer(name, code, text):
    (log,) = _logs(name)
    (error,) = [e for e in log if e["type"] == "llm/error"]
    (retry,) = [e for e in log if e["type"] == "llm/retry"]
    assert error["code"] == retry["code"] == code and error["retryable"] is True
    assert [e["type"] for e in log].index("llm/retry") < [e["type"] for e in log].index("assistant/message")
    assert log[-1] == {**log[-1], "type": "turn/end", "reason": "completed"}
    assert _chunks(name) == [text]
    if code == "RATE_LIMIT":
        assert error["status"] == 429


@pytest.mark.parametrize("name, code", [("missing-credential", "MISSING_CREDENTIAL"),
                                        ("invalid-credential", "INVALID_CREDENTIAL")])
def test_credential_scenarios_fail_the_turn_without_retrying(name, code):
    (log,) = _logs(name)
    end = log[-1]
    assert end["type"] == "turn/end" and end["reason"] == "error" and end["code"] == code
    assert not [e for e in log if e["type"] in ("llm/retry", "assistant/message")]
    assert [e["code"] for e in log if e["type"] == "llm/error"] == [code]
    (answer,) = [f for f in _wire(name) if f.get("id") == 3]
    assert answer["error"]["code"] == -32603 and "API key" in answer["error"]["message"]  # the prompt failed
    assert "sk-pasted" not in json.dumps(log) + json.dumps(_wire(name))  # the key is never echoed


def test_startup_activation_error_scenario_stops_before_the_front_door():
    d = scenario_dir(STARTUP)
    exit_line, stderr = (d / "stderr.expected.txt").read_text().split("\n", 1)
    assert exit_line.startswith("exit code ") and exit_line != "exit code 0"
    assert "deepseek-model" in stderr and "retry" in stderr and "Traceback" not in stderr
    assert (d / "stdout.expected.jsonl").read_text().strip() == "" and not (d / "session.jsonl").exists()


def test_delete_recreate_scenario():
    first, _rm, again, write = _results(_logs("fs-delete-recreate")[0])
    assert "old contents" in first and "does not exist" in again and write.endswith("\nCreated file\n</content>")


def test_escalation_scenarios_ask_once_per_call():
    assert _permission_requests("fs-escalation-approved") == 1
    assert _permission_requests("partial-landlock-child-failure") == 2
    (log,) = _logs("fs-escalation-approved")
    assert [e["outcome"] for e in log if e["type"] == "approval/decided"] == ["allowed-once"]
    assert _results(log) == ["<path>{{cwd}}/escalated.md</path>\n<type>file</type>\n<content>\nCreated file\n</content>"]


def test_read_window_scenario():
    (result,) = _results(_logs("fs-read-window")[0])
    assert "line 5\n" in result and "line 8\n" in result and "line 4\n" not in result and "line 9\n" not in result


def test_overwrite_scenario_reads_then_overwrites():
    read, write = _results(_logs("fs-write-overwrite")[0])
    assert "\n1: original\n" in read and write == "<path>{{cwd}}/data.txt</path>\n<type>file</type>\n<content>\nUpdated file\n</content>"


def test_glob_scenario_samples_over_the_cap():
    (result,) = _results(_logs("fs-glob-sampling")[0])
    lines = result.splitlines()
    assert lines[-1].startswith("[more than 1000 matches: a sample across the top-level entries")
    for path in ("tree/docs/f0002.txt", "tree/src/f0001.txt", "tree/README.md", "tree/docs", "tree/src"):
        assert path in lines
    assert len(lines) == 1001


def test_parallel_tool_calls_scenario():
    (log,) = _logs("parallel-tool-calls")
    (call,) = [e for e in log if e["type"] == "assistant/message" and e.get("finish") == "tool-calls"]
    assert [b["name"] for b in call["message"]["content"] if b["type"] == "tool-call"] == ["read", "read"]
    assert [r.splitlines()[3] for r in _results(log)] == ["1: contents of a", "1: contents of b"]


def test_wide_image_scenario_stores_the_bytes_unchanged():
    # the attachment store names objects by their bytes' sha256: this digest in the log is WIDE, unresized
    assert hashlib.sha256(WIDE).hexdigest() in json.dumps(_logs("read-image-dimension"))
    assert (scenario_dir("read-image-dimension") / "workspace" / "wide.png").read_bytes() == WIDE


def test_session_root_scenario_works_in_the_session_cwd():
    (log,) = _logs("session-sandbox-root")
    assert log[0]["cwd"] == "{{cwd}}/session-root"
    assert _results(log)[1].splitlines()[0] == "{{cwd}}/session-root"  # bash's pwd


def test_workspace_edit_scenario_appends():
    assert _results(_logs("workspace-edit")[0])[1].startswith("HELLO\nWORLD")  # cat after the append


def test_partial_landlock_scenario_keeps_the_notice_off_the_results():
    (log,) = _logs("partial-landlock-child-failure")
    assert _results(log) == ["(no output)\n[exit code: 1]", "out\n[stderr]\nerr\n[exit code: 125]"]
    text = json.dumps(log) + json.dumps(_wire("partial-landlock-child-failure"))
    assert "SANDBOX_UNAVAILABLE" not in text and "landlock-run" not in text


def test_max_tokens_mid_tool_call_scenario_drops_the_calls_and_continues():
    (log,) = _logs("max-tokens-tool-call")
    cut = next(e for e in log if e["type"] == "assistant/message")
    assert cut["finish"] == "max-tokens" and [b["type"] for b in cut["message"]["content"]] == ["text"]
    assert [e["reason"] for e in log if e["type"] == "turn/end"] == ["max-tokens", "completed"]
    (result,) = _results(log)  # neither call of the cut message ran; the next turn's one did
    assert "contents of b" in result
    assert _chunks("max-tokens-tool-call") == [
        "Reading both. ", "b says: <path>{{cwd}}/b.txt</path>\n<type>file</type>\n<content>\n1: contents of b\n\n"
        "(End of file - total 1 lines)\n</content>"]


@pytest.mark.parametrize("name, needles", [
    ("subagent-one", ["CHILD ANSWER to <child: say PONG>"]),
    ("subagent-sequential", ["CHILD ANSWER to <child: first>", "CHILD ANSWER to <child: second>"]),
    ("subagent-parallel", ["CHILD ANSWER to <child: left>", "CHILD ANSWER to <child: right>"]),
])
def test_subagent_scenarios_bring_each_child_answer_back(name, needles):
    parent, *children = _logs(name)
    assert len(children) == len(needles)
    results = _results(parent)
    assert results == [f"[subagent completed]\n{n}" for n in needles]
    for child, needle in zip(children, needles, strict=True):
        assert needle in "".join(_chunk_texts(child))


def _chunk_texts(log: list[dict]) -> list[str]:
    return [b.get("text", "") for e in log if e["type"] == "assistant/message" for b in e["message"]["content"]]


def test_parallel_children_scenario_starts_both_before_either_result():
    parent = _logs("subagent-parallel")[0]
    (call,) = [e for e in parent if e["type"] == "assistant/message" and e.get("finish") == "tool-calls"]
    assert [b["name"] for b in call["message"]["content"] if b["type"] == "tool-call"] == [_CHILD, _CHILD]
    kinds = [e["type"] for e in parent if e["type"] in ("tool/call", "tool/result")]
    assert kinds == ["tool/call", "tool/call", "tool/result", "tool/result"]


def test_cut_child_scenario_keeps_the_partial_output():
    parent, child = _logs("subagent-max-tokens-partial")
    assert [e["reason"] for e in child if e["type"] == "turn/end"] == ["max-tokens"]
    # over ACP a dsh child's max-tokens turn settles as end_turn (ACP-7) with _meta.dsh.turnEnd, which
    # the parent reads: the child was cut short, not done (issue 25)
    assert _results(parent) == ["[subagent stopped: max tokens]\nOnce upon a time there was"]


def test_depth_two_scenario_refuses_the_third_level():
    parent, *children = _logs("subagent-depth-two-rejection")
    (result,) = _results(parent)
    assert "subagent depth limit reached (this agent is at depth 2, the limit is 2)" in result
    assert len(children) == 2  # depths 1 and 2; nobody at depth 3
    assert [e.get("code") for e in children[1] if e["type"] == "tool/result"] == ["DEPTH_LIMIT"]
