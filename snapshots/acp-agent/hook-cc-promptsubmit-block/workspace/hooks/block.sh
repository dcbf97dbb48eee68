#!/bin/sh
cat > .prompt-payload.json
grep -q 'Delete everything' .prompt-payload.json || exit 0
echo 'blocked by policy hook' >&2
exit 2
