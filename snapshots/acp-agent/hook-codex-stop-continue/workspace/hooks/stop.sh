#!/bin/sh
cat > .stop-payload-$(ls .stop-payload-* 2>/dev/null | wc -l).json
if [ -f .stop_fired ]; then exit 0; fi
touch .stop_fired
echo 'Also reply with the single word SECOND, then stop.' >&2
exit 2
