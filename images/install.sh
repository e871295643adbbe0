#!/bin/sh
# install.sh: install what a QCP machine image holds into the root file
# system DESTDIR, for an image builder (Packer, image-builder) or for the
# process provider, which boots its machines from the tree this makes.
#
#   DESTDIR=/mnt/root images/install.sh <bin-dir> [<qcp-agent>]
#
# <bin-dir> holds the pinned binaries as `make binaries` builds them:
# etcd-<version> and kube-<version> (the multi-call Kubernetes binary).
# Every version there is installed, so that one image offers them all;
# the bootstrap document names the versions a machine runs. <qcp-agent>
# defaults to <bin-dir>/qcp-agent.
#
# The tree:
#   /usr/local/bin/qcp-agent
#   /opt/qcp/bin/etcd-<version>, /opt/qcp/bin/kube-<version>
#   /etc/systemd/system/qcp-agent.service.d/   (drop-ins; the unit itself
#                                               comes with the cloud-config)
#   /var/lib/qcp                               (the agent's data, 0700)
#
# With LINK=1 files are hard-linked instead of copied where source and
# destination share a file system: the process provider installs a tree
# per management cluster, and the binaries are hundreds of megabytes.
set -eu

bindir=${1:?usage: DESTDIR=<root> $0 <bin-dir> [<qcp-agent>]}
agent=${2:-$bindir/qcp-agent}
: "${DESTDIR:?set DESTDIR to the root file system to install into}"

put() { # put <source> <destination>: a regular file, mode 0755
	if [ "${LINK:-0}" = 1 ] && ln -fL "$1" "$2" 2>/dev/null; then
		return
	fi
	cp -fL "$1" "$2.tmp" && chmod 0755 "$2.tmp" && mv -f "$2.tmp" "$2"
}

[ -f "$agent" ] || { echo "$0: qcp-agent not found at $agent: build it with make qcp-binaries" >&2; exit 1; }
install -d -m 0755 "$DESTDIR/usr/local/bin" "$DESTDIR/opt/qcp/bin" "$DESTDIR/etc/systemd/system/qcp-agent.service.d"
install -d -m 0700 "$DESTDIR/var/lib/qcp"
put "$agent" "$DESTDIR/usr/local/bin/qcp-agent"

found=0
for f in "$bindir"/etcd-v* "$bindir"/kube-v*; do
	[ -e "$f" ] || continue
	put "$f" "$DESTDIR/opt/qcp/bin/$(basename "$f")"
	found=$((found + 1))
done
[ "$found" -gt 0 ] || { echo "$0: no etcd-v* or kube-v* in $bindir: build them with make binaries" >&2; exit 1; }
echo "installed qcp-agent and $found pinned binaries into $DESTDIR"
