#!/usr/bin/env bash
# Pins the test dependencies: resolves the test extra afresh (today's newest releases within
# pyproject's ranges) in a throwaway virtual environment and writes every installed version
# to constraints/test.txt, which the README's test command and .ci/run install with
# (`pip install -c constraints/test.txt -e ".[test]"`). stratamem itself is left out.
# Run it on the CI's platform (CPython 3.11, Linux x86-64), then run the suite and commit
# the file with what the upgrade needed (see docs/development.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
python3 -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install --quiet ".[test]"
{
  echo "# The test dependencies, pinned: the README's test command and .ci/run install with"
  echo "# \`pip install -c constraints/test.txt -e \".[test]\"\`, so that a new upstream release"
  echo "# cannot change what CI runs. Written by scripts/lock_test_deps.sh on"
  echo "# $("$scratch/venv/bin/python" -c 'import platform; print(platform.python_implementation(), platform.python_version(), platform.system(), platform.machine())');"
  echo "# refresh it with that script (docs/development.md). Do not edit by hand."
  "$scratch/venv/bin/pip" freeze --exclude stratamem
} > constraints/test.txt.new
mv constraints/test.txt.new constraints/test.txt
echo "constraints/test.txt: $(grep -c '==' constraints/test.txt) pins"
