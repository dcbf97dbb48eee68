"""dsh plugin ``goals``: one durable goal per session and the driver that works on it.

- Tools ``create_goal {objective, max_goal_rounds?}``, ``get_goal {}`` and ``update_goal
  {goal_id, revision, action, objective?, max_goal_rounds?, blocked_reason?}`` (``tools``);
- the goal lives in the session log (``goal/change`` and ``goal/round`` notes, ``domain``); a
  resumed session folds them back at its first turn, disarmed;
- the round driver (``driver``) starts the next round as an autonomous turn whenever a turn ends
  with the goal active and armed;
- the system-prompt section is ``guidance.GUIDANCE`` (wired by the host's guidance hook).

See README.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from msgspec import Meta

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig

from . import driver
from .tools import make_tools, state

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, Host, Tool

NAME = "goals"


class GoalsConfig(PluginConfig):
    """[config.goals]"""

    default_max_goal_rounds: Annotated[int, Meta(ge=1, le=2**53 - 1, description=(
        "automatic rounds a goal gets when create_goal names no max_goal_rounds"))] = 256
    blocked_after_rounds: Annotated[int, Meta(ge=1, description=(
        "rounds a goal must have run before a round may mark it blocked"))] = 3


dsh_config_type = config_type_hook(NAME, GoalsConfig)


@hookimpl
def dsh_register_tools(register: Callable[[Tool], None], host: Host) -> None:
    for tool in make_tools(host.config_for(GoalsConfig)):
        register(tool)


class _Recall:
    """A resumed session's goal, folded from its log (disarmed: it never wakes on its own)."""

    def __init__(self, session: Agent) -> None:
        self.session = session

    async def decide(self) -> None:
        st = state(self.session)
        if st.loaded:
            return
        try:
            _, events = await self.session.host.session_store.read(self.session.session_id)
        except Exception as exc:  # a store that cannot read back: the session goes on without its goal
            driver.log.warning(f"session {self.session.session_id}: its goal could not be read back: {exc!r}")
            events = []
        st.fold(events)


@hookimpl
def dsh_session_start(session: Agent, source: str, turn: int) -> _Recall | None:
    if source == "resume":
        return _Recall(session)
    state(session).loaded = True
    return None


@hookimpl
def dsh_check_step(session: Agent, turn: int, step: int) -> None:
    driver.admit(session, turn, step)  # no opinion on the step itself


# The events the driver reads, of every session: its observer itself, not a function that calls it.
dsh_session_event = hookimpl(driver.observe)




@hookimpl
def dsh_register_guidance(register: Callable[[Any], None], host: Host) -> None:
    from dsh_core import Guidance

    from .guidance import NAME as SECTION
    from .guidance import ORDER, TOOLS, guidance_text

    register(Guidance(name=SECTION, order=ORDER, tools=TOOLS,
                      text=guidance_text(host.config_for(GoalsConfig).blocked_after_rounds)))
