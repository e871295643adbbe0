#!/usr/bin/env bash
# Fails if any process a test started is still running: a binary from the
# given bin directory (etcd, kube, CAPI core, qcp-*) or a qcp-agent machine or
# load balancer, wherever the agent was built.
set -euo pipefail
bin=$(realpath "$1")
strays=()
for dir in /proc/[0-9]*; do
  pid=${dir#/proc/}
  [ "$pid" = $$ ] && continue
  target=$(readlink "$dir/exe" 2>/dev/null) || continue
  cmd=$(tr '\0' ' ' < "$dir/cmdline" 2>/dev/null | cut -c1-200) || continue
  case $target in
    "$bin"/*) strays+=("$pid $cmd"); continue ;;
  esac
  case $cmd in
    *qcp-agent\ run\ --dir*|*qcp-agent\ lb\ --dir*) strays+=("$pid $cmd") ;;
  esac
done
if [ ${#strays[@]} -gt 0 ]; then
  echo "stray processes left running:" >&2
  printf '  %s\n' "${strays[@]}" >&2
  exit 1
fi
echo "no stray processes: every process the tests started has ended"
