#!/bin/sh
touch .must-not-run
echo 'must not run' >&2
exit 2
