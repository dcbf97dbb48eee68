#!/bin/sh
echo 'tool output rejected by codex policy: summarize instead' >&2
exit 2
