#!/bin/sh
cat > .prompt-payload.json
printf '%s\n' '{"hookSpecificOutput":{"hookEventName":"UserPromptSubmit","additionalContext":"The user has previously stated their favorite color is teal."}}'
