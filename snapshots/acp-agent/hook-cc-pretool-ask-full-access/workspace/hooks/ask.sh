#!/bin/sh
cat > .pretool-payload.json
printf '%s\n' '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"ask","permissionDecisionReason":"bash requires manual approval in this session"}}'
