"""The Landlock launcher's ``--hide``: reads granted beside the way down to a hidden directory.

The through-ACP tests (tests/security/test_stored_key.py, test_sandbox_escape.py, the lsp
confinement tests) show the stored key unreadable from every confined path; these pin the rules
themselves and each edge the README names (symlinks, bind mounts, files made later, a hidden
directory that does not exist), with the real launcher on the real kernel.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dsh_sandbox_tools import _landlock_exec as ll
from dsh_sandbox_tools.mechanisms import LAUNCHER
from dsh_sandbox_tools.testing import require_mechanism

KEY = "sk-hidden-9d3e"


@pytest.fixture
def tree() -> Iterator[Path]:
    """Outside every writable root (as ~/.config/dsh is): cfg/credentials/key, cfg/config.toml, other/."""
    d = Path("/var/tmp") / f"dsh-test-hide-{secrets.token_hex(4)}"
    (d / "cfg" / "credentials").mkdir(parents=True)
    (d / "cfg" / "credentials" / "key").write_text(KEY)
    (d / "cfg" / "config.toml").write_text("setting = 1\n")
    (d / "other").mkdir()
    (d / "other" / "file").write_text("readable\n")
    (d / "link-to-creds").symlink_to(d / "cfg" / "credentials")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def launch(rw: list[Path], hide: list[Path], command: str, prefix: list[str] = ()) -> subprocess.CompletedProcess[str]:
    args = [a for r in rw for a in ("--rw", str(r))] + [a for h in hide for a in ("--hide", str(h))]
    return subprocess.run([*prefix, sys.executable, "-I", "-S", LAUNCHER, *args, "--rw-file", "/dev/null", "--",
                           "sh", "-c", command], capture_output=True, text=True, timeout=60)


def test_the_rules_grant_everything_beside_the_way_down_and_nothing_on_it(tree: Path) -> None:
    creds = tree / "cfg" / "credentials"
    rules = dict(ll.hide_rules([str(creds)]))
    assert rules[str(tree / "cfg")] == ll.READ_DIR and rules[str(tree)] == ll.READ_DIR and rules["/"] == ll.READ_DIR
    assert rules[str(tree / "cfg" / "config.toml")] == ll.READ_FILE
    assert rules[str(tree / "other")] == ll.READ_FILE | ll.READ_DIR
    assert str(creds) not in rules and str(tree / "link-to-creds") not in rules  # a symlink is never granted itself
    assert rules["/usr"] == ll.READ_FILE | ll.READ_DIR and rules["/var"] == ll.READ_DIR  # /var is on the way


def test_a_bind_mount_that_shows_the_hidden_directory_elsewhere_is_an_alias(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
        "40 27 254:0 /home /mnt/all\\040homes rw,relatime - ext4 /dev/vda rw\n"
        "41 27 254:0 /srv/data /data rw,relatime - ext4 /dev/vda rw\n"
        "42 27 0:50 /home /mnt/other-fs rw,relatime - tmpfs tmpfs rw\n")
    creds = "/home/alice/.config/dsh/credentials"
    assert ll.mount_aliases(creds, str(info)) == ["/mnt/all homes/alice/.config/dsh/credentials"]
    # seen from inside a bind mount, the original place is the alias
    assert ll.mount_aliases("/data/cfg/credentials", str(info)) == ["/srv/data/cfg/credentials"]
    assert ll.mount_aliases("/proc/x", str(info)) == []


def test_a_missing_directory_is_hidden_unless_a_writable_root_holds_it(tree: Path, tmp_path: Path) -> None:
    missing_outside = tree / "cfg2" / "credentials"
    missing_inside = tmp_path / "cfg" / "credentials"
    present_inside = tmp_path / "present"
    present_inside.mkdir()
    got = ll.hidden_in_force([str(missing_outside), str(missing_inside), str(present_inside)], [str(tmp_path)])
    assert got == [str(missing_outside), os.path.realpath(present_inside)]


def test_the_launcher_hides_the_key_and_leaves_the_rest_readable(tree: Path, tmp_path: Path) -> None:
    require_mechanism("landlock")
    key = tree / "cfg" / "credentials" / "key"
    (tmp_path / "planted").symlink_to(key)
    got = launch([tmp_path], [tree / "cfg" / "credentials"],
                 f"cat {key}; cat {tmp_path}/planted; cat {tree}/link-to-creds/key; cat /proc/self/root{key}; "
                 f"cd {tree}/cfg/credentials && cat key; cd /; "
                 f"ln {key} {tmp_path}/hard; mv {tree}/cfg/credentials {tmp_path}/moved; "
                 f"cat {tree}/cfg/config.toml {tree}/other/file; ls {tree}/cfg/credentials; "
                 f"echo new > {tmp_path}/new && cat {tmp_path}/new")
    assert KEY not in got.stdout + got.stderr, got
    assert got.stderr.count("Permission denied") >= 5, got.stderr
    assert got.stdout == "setting = 1\nreadable\nkey\nnew\n", got  # names stay listable, contents do not
    assert key.read_text() == KEY and not (tmp_path / "hard").exists() and not (tmp_path / "moved").exists()


def test_a_file_made_later_in_a_directory_on_the_way_is_unreadable(tree: Path) -> None:
    """The documented cost: an entry created in a directory on the way down after the ruleset was
    built is not granted (a key stored while a session runs is hidden for the same reason)."""
    require_mechanism("landlock")
    got = launch([tree], [tree / "cfg" / "credentials"],
                 f"echo early > {tree}/other/early && cat {tree}/other/early; "
                 f"echo late > {tree}/cfg/late; cat {tree}/cfg/late")
    assert got.stdout == "early\n" and "late: Permission denied" in got.stderr, got


def test_a_bind_mounted_ancestor_does_not_show_the_key(tree: Path) -> None:
    """A bind mount of the config directory made before the launcher runs (in a private mount
    namespace, so the host is untouched): the key is hidden at that place too."""
    require_mechanism("landlock")
    alias = tree / "other" / "mnt"
    alias.mkdir()
    prefix = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    try:
        subprocess.run([*prefix, "true"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a mount namespace here ({exc}): the mountinfo test covers the aliasing")
    got = subprocess.run([*prefix, "sh", "-c", f'mount --bind {tree}/cfg {alias} && exec "$@"', "sh",
                          sys.executable, "-I", "-S", LAUNCHER, "--hide", str(tree / "cfg" / "credentials"), "--",
                          "sh", "-c", f"cat {alias}/credentials/key; cat {alias}/config.toml"],
                         capture_output=True, text=True, timeout=60)
    assert KEY not in got.stdout, got
    assert got.stdout == "setting = 1\n" and "Permission denied" in got.stderr, got
