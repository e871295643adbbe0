#!/usr/bin/env bash
# build-beside.sh OUT COMMAND...: runs COMMAND, which builds the pinned
# binary OUT, at the lowest CPU priority. `make test` runs it in the
# background beside the tests: the build takes only the CPU the tests leave
# idle, and only the tests that need OUT wait for it
# (testkit.BinaryBuilding; test/e2e's scenario queue starts them once it is
# built). While it runs, the marker <dir>/.<name>.building says
# "building <pid>"; it is removed once OUT is in place, and says where the
# log is if the build failed. The log is <dir>/.<name>.log. Exits with the
# build's status.
set -uo pipefail
out=$1
shift
dir=$(dirname "$out") name=$(basename "$out")
marker=$dir/.$name.building log=$dir/.$name.log
echo "building $$" > "$marker"
if nice -n 19 "$@" > "$log" 2>&1; then
	rm -f "$marker"
	exit 0
fi
echo "failed: see $log" > "$marker"
echo ">> building $name beside the tests failed; the end of $log:" >&2
tail -n 40 "$log" >&2
exit 1
