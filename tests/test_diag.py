"""Diagnostics are bounded, because ACP clients may never read stderr (docs/acp-contract.md#client-facts, 4)."""

from dsh_core import diag


def test_warnings_stop_at_the_budget_with_one_notice(capfd, monkeypatch):
    monkeypatch.delenv("DSH_DEBUG", raising=False)
    monkeypatch.setattr(diag, "_spent", 0)
    for i in range(10_000):
        diag.warn(f"something went wrong number {i}")
    err = capfd.readouterr().err
    assert len(err.encode()) < diag.BUDGET + 200
    assert err.count("further diagnostics suppressed") == 1
    diag.debug("client noise")
    assert capfd.readouterr().err == ""


def test_debug_lifts_the_budget(capfd, monkeypatch):
    monkeypatch.setenv("DSH_DEBUG", "1")
    monkeypatch.setattr(diag, "_spent", diag.BUDGET)
    diag.warn("still shown")
    diag.debug("client noise")
    err = capfd.readouterr().err
    assert "dsh: still shown" in err and "dsh: client noise" in err
