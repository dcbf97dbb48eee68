"""dsh-session-export: ``dsh sessions export`` (an action of jsonl-persistence's ``dsh sessions``,
entry point group ``dsh.sessions``). Not a plugin an example mounts: it reads the logs a
composition wrote. See README.md."""
