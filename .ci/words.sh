#!/usr/bin/env bash
# The project speaks of itself only: docs, comments, scripts and help texts name dates, commits,
# machines and figures. This check fails on the word for a unit of someone's working time in any
# tracked text file (the word is assembled here so that this file passes its own check).
set -euo pipefail
cd "$(dirname "$0")/.."
word="sess""ion"
if git ls-files -z | xargs -0 grep -I -n -i -w -e "$word" -e "${word}s"; then
    echo "error: the lines above say '$word'; write a date, a commit hash or a machine instead" >&2
    exit 1
fi
echo "no '$word' in $(git ls-files | wc -l) tracked files"
