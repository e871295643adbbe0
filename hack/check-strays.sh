#!/usr/bin/env bash
# Fails if any process still runs a binary from the given bin directory: after
# the test suite, every etcd, kube, CAPI core or machine process a test started
# must be gone.
set -euo pipefail
bin=$(realpath "$1")
strays=()
for exe in /proc/[0-9]*/exe; do
  target=$(readlink "$exe" 2>/dev/null) || continue
  case $target in "$bin"/*)
    pid=${exe#/proc/}; pid=${pid%/exe}
    strays+=("$pid $(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | cut -c1-160)") ;;
  esac
done
if [ ${#strays[@]} -gt 0 ]; then
  echo "stray processes left running from $bin:" >&2
  printf '  %s\n' "${strays[@]}" >&2
  exit 1
fi
echo "no stray processes from $bin"
