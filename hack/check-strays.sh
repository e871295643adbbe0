#!/usr/bin/env bash
# Fails if any process a test started is still running. Usage:
#   check-strays.sh BIN_DIR [RUN_ID]
# A stray is a process running a binary from BIN_DIR (etcd, kube, CAPI core,
# qcp-*), or, given the RUN_ID `make test` put in QCP_TEST_RUN, any process
# whose environment carries it: every process the tests started inherits it,
# wherever its binary was built (a qcp-manager built into a temporary
# directory, envtest's etcd). Without a RUN_ID, qcp-agent machines and load
# balancers count too, wherever the agent was built. Network namespaces and
# links the tests made count as strays too.
set -euo pipefail
bin=$(realpath "$1")
run=${2:-}
strays=()
# The processes this check runs under (make, and the profile recorder of
# `make test`, built into BIN_DIR) are not strays.
ancestors=" "
p=$$
while [ "$p" -gt 1 ] 2>/dev/null; do
  ancestors+="$p "
  p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) || break
done
for dir in /proc/[0-9]*; do
  pid=${dir#/proc/}
  case $ancestors in *" $pid "*) continue ;; esac
  target=$(readlink "$dir/exe" 2>/dev/null) || continue
  cmd=$(tr '\0' ' ' < "$dir/cmdline" 2>/dev/null | cut -c1-200) || continue
  case $target in
    "$bin"/*) strays+=("$pid $cmd"); continue ;;
  esac
  if [ -n "$run" ]; then
    if tr '\0' '\n' < "$dir/environ" 2>/dev/null | grep -qx "QCP_TEST_RUN=$run"; then
      strays+=("$pid $cmd")
    fi
    continue
  fi
  case $cmd in
    *qcp-agent\ run\ --dir*|*qcp-agent\ lb\ --dir*) strays+=("$pid $cmd") ;;
  esac
done
# Machines on a network of their own (qcp-manager --machine-network=namespaces,
# internal/hostnet's tests) leave network namespaces named qcp-* and links
# named qcp* (bridges, veth host ends) when their teardown is skipped.
net=()
if command -v ip >/dev/null 2>&1; then
  while read -r ns _; do
    case $ns in qcp-*) net+=("network namespace $ns") ;; esac
  done < <(ip netns list 2>/dev/null)
  while read -r link; do
    case $link in qcp*) net+=("link $link") ;; esac
  done < <(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1)
fi
status=0
if [ ${#strays[@]} -gt 0 ]; then
  echo "stray processes left running:" >&2
  printf '  %s\n' "${strays[@]}" >&2
  status=1
fi
if [ ${#net[@]} -gt 0 ]; then
  echo "network namespaces or links left behind:" >&2
  printf '  %s\n' "${net[@]}" >&2
  status=1
fi
[ $status -eq 0 ] || exit 1
echo "no stray processes, namespaces or links: everything the tests started has ended"
