"""The project is self-contained: the vendored ACP schema is the upstream file its SOURCE.md names\nand the tests use it; every ACP-n cited resolves to docs/acp-contract.md; nothing points outside."""

from __future__ import annotations

import hashlib
import os
import re
from importlib.resources import files
from pathlib import Path

from dsh_testing import REPO, acp_schema, acp_validator

VENDOR = files("dsh_testing").joinpath("_vendor", "acp")


def recorded_hashes() -> dict[str, str]:
    """``file here -> sha256`` from the provenance table in SOURCE.md."""
    rows = re.findall(r"^\| `([^`]+)` \| `[^`]+` \| `([0-9a-f]{64})` \|$", VENDOR.joinpath("SOURCE.md").read_text(), re.M)
    return dict(rows)


def test_vendored_files_match_recorded_provenance():
    recorded = recorded_hashes()
    assert set(recorded) == {"schema.json", "LICENSE"}
    for name, digest in recorded.items():
        assert hashlib.sha256(VENDOR.joinpath(name).read_bytes()).hexdigest() == digest, name
    source = VENDOR.joinpath("SOURCE.md").read_text()
    assert "b7f0005493b98de32fabee3e9540e2b64da68535" in source and "v1.21.0" in source
    assert "Apache License" in VENDOR.joinpath("LICENSE").read_text()


def test_frame_validator_uses_the_vendored_schema():
    assert acp_schema()["$defs"].keys() >= {"AgentRequest", "AgentResponse", "AgentNotification"}
    v = acp_validator()
    ok = {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}}
    bad = {"jsonrpc": "2.0", "id": 0, "error": {"code": "oops", "message": "the code must be an integer"}}
    assert not list(v.iter_errors(ok))
    assert list(v.iter_errors(bad))
    # a known method's params are checked against that method's definition, not the extension branch
    update = {"jsonrpc": "2.0", "method": "session/update",
              "params": {"sessionId": "s", "update": {"sessionUpdate": "tool_call", "toolCallId": "c", "title": "t"}}}
    assert not list(v.iter_errors(update))
    del update["params"]["update"]["toolCallId"]
    assert list(v.iter_errors(update))
    asked = {"jsonrpc": "2.0", "id": 1, "method": "session/request_permission", "params": {"sessionId": "s"}}
    assert list(v.iter_errors(asked))  # no toolCall, no options


# ------------------------------------------------------------------ the project cites only itself

CONTRACT = REPO / "docs" / "acp-contract.md"
SKIP_PARTS = {".git", ".venv", ".tox", ".mypy_cache", ".ruff_cache", "__pycache__", "_vendor", "build", "dist", "snapshots"}


def project_text_files() -> list[Path]:
    """The project's own source and docs (not the vendored schema, pinned snapshots or build output)."""
    files = []
    for top, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_PARTS and not d.endswith(".egg-info")]
        files += [Path(top, n) for n in names if Path(n).suffix in {".py", ".md", ".toml", ".ini", ".cfg", ".txt", ""}]
    return files


def test_every_cited_acp_rule_has_an_anchor_in_the_contract():
    anchors = set(re.findall(r'<a id="(acp-\d+)"></a>', CONTRACT.read_text()))
    assert anchors == {f"acp-{n}" for n in range(1, 14)}
    cited = {}
    for path in project_text_files():
        for n in re.findall(r"\bACP-(\d+)\b", path.read_text(errors="replace")):
            cited.setdefault(f"acp-{n}", path)
    assert cited, "nothing cites the contract?"
    missing = {rule: str(path) for rule, path in cited.items() if rule not in anchors}
    assert not missing


def test_nothing_refers_outside_the_repository():
    forbidden = re.compile("|".join([r"\.\./" + "shared", "DSH_" + "SHARED_DIR", r'parent / "' + 'shared"',
                                     "/work/" + "shared", "DESIGN" + r"\.md", "INTEROP" + r"\.md"]))
    offenders = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in project_text_files()
                 for m in [forbidden.search(p.read_text(errors="replace"))] if m]
    assert not offenders
