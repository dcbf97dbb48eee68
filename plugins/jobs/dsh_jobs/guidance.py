"""How to use background jobs well: the system-prompt section (``dsh_register_guidance``) of the
job tools, for every agent that has them."""

from __future__ import annotations

from dsh_core.types import Guidance

JOBS = Guidance(
    name="tool:jobs",
    order=106,
    tools=("job_output", "job_list", "job_kill"),
    text="Keep track of the id of every background job you start. You are told in this conversation when "
    "a job ends, so do not poll it or sleep while waiting: go on with the steps that do not depend on it, "
    "and do not start the same work again while it runs. Before your final answer, read every job whose "
    "result still matters with job_output (wait: true only when you cannot go on without it), and stop "
    "the jobs that no longer matter with job_kill.",
)

SECTIONS = (JOBS,)
