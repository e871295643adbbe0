#!/usr/bin/env bash
# Each process machine's kube-apiserver, kube-controller-manager and
# kube-scheduler hold about 14 inotify instances between them (one per
# certificate file they watch), and Linux allows 128 per user by default:
# nine machines exhaust it, and then the next CAPI core, kube-apiserver or
# etcd fails to start with "too many open files". kind asks its users to
# raise the same limit. This raises it when it may (root, writable
# /proc/sys) and says so, or else says how.
set -euo pipefail
want=${QCP_INOTIFY_INSTANCES:-1024}
knob=/proc/sys/fs/inotify/max_user_instances
have=$(cat "$knob" 2>/dev/null || echo 0)
if [ "$have" -ge "$want" ]; then
  exit 0
fi
if [ -w "$knob" ] && echo "$want" > "$knob" 2>/dev/null; then
  echo ">> raised fs.inotify.max_user_instances from $have to $want: each process machine holds about 14 inotify instances"
else
  echo ">> warning: fs.inotify.max_user_instances is $have; with more than about 8 process machines at once, components fail with 'too many open files'." >&2
  echo ">>          raise it with: sudo sysctl fs.inotify.max_user_instances=$want" >&2
fi
