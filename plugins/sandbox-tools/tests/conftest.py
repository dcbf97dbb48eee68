"""Fixtures: a workspace under /tmp, directories outside every writable root (and HOME there), a clean env
(``dsh_sandbox_tools.testing``: the same fixtures serve every plugin whose tests run the sandbox)."""

from __future__ import annotations

import dsh_sandbox_tools.testing as sandbox_fixtures

# the fixtures of every plugin whose tests run the sandbox: a clean env and HOME outside the roots
# (autouse), a workspace, a directory in no writable root
_home, outside, root = sandbox_fixtures._home, sandbox_fixtures.outside, sandbox_fixtures.root
