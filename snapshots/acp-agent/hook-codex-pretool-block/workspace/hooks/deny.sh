#!/bin/sh
cat > .pretool-payload.json
echo 'bash is disabled by policy in this session' >&2
exit 2
