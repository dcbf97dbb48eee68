#!/bin/sh
cat > .prompt-payload.json
echo 'The user has previously stated their favorite color is teal.'
