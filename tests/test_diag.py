"""Diagnostics are bounded, because ACP clients may never read stderr (docs/acp-contract.md#client-facts, 4)."""

from dsh_core import diag


def test_warnings_stop_at_the_budget_with_one_notice(capfd, monkeypatch):
    monkeypatch.delenv("DSH_DEBUG", raising=False)
    monkeypatch.setattr(diag.handler, "spent", 0)
    for i in range(10_000):
        diag.warn(f"something went wrong number {i}")
    err = capfd.readouterr().err
    assert len(err.encode()) < diag.BUDGET + 200
    assert err.count("further diagnostics suppressed") == 1
    diag.debug("client noise")
    assert capfd.readouterr().err == ""


def test_debug_lifts_the_budget(capfd, monkeypatch):
    monkeypatch.setenv("DSH_DEBUG", "1")
    monkeypatch.setattr(diag.handler, "spent", diag.BUDGET)
    diag.warn("still shown")
    diag.debug("client noise")
    err = capfd.readouterr().err
    assert "dsh: still shown" in err and "dsh: client noise" in err


def test_plugins_log_through_the_standard_library_under_the_budget(capfd, monkeypatch):
    """``logging.getLogger("dsh.<plugin>")`` is how a plugin warns: one line, named, on stderr
    (never stdout), debug only with DSH_DEBUG=1, and the same budget as the spine's warnings."""
    import logging

    monkeypatch.delenv("DSH_DEBUG", raising=False)
    monkeypatch.setattr(diag.handler, "spent", 0)
    log = logging.getLogger("dsh.my-plugin")
    log.warning("disk is %s", "full")
    log.debug("chatter")
    out, err = capfd.readouterr()
    assert out == "" and err == "dsh: my-plugin: disk is full\n"
    monkeypatch.setenv("DSH_DEBUG", "1")
    log.debug("chatter")
    assert capfd.readouterr().err == "dsh: my-plugin: chatter\n"
    monkeypatch.delenv("DSH_DEBUG")
    monkeypatch.setattr(diag.handler, "spent", diag.BUDGET - 10)
    log.warning("the last one")
    log.warning("never shown")
    err = capfd.readouterr().err
    assert err.startswith("dsh: my-plugin: the last one\n") and "suppressed" in err and "never shown" not in err
