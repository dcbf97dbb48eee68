"""The vendored ACP schema is the upstream file its SOURCE.md names, and the tests use it."""

from __future__ import annotations

import hashlib
import re
from importlib.resources import files

from dsh_core.testing import acp_schema, acp_validator

VENDOR = files("dsh_core").joinpath("_vendor", "acp")


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
