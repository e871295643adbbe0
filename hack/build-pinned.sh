#!/usr/bin/env bash
# Builds one pinned binary from its wrapper module under hack/tools/, through
# the Go module proxy only:   hack/build-pinned.sh etcd|kube|capi|cabpk|clusterctl VERSION OUT
# (capi is CAPI core's manager, cabpk its kubeadm bootstrap provider,
# clusterctl its CLI: all come from the one cluster-api module, through the
# capi wrapper).
# The committed wrapper go.mod pins the default version; another version is
# built from a temporary copy whose go.mod is rewritten for it.
set -euo pipefail
tool=$1 version=$2 out=$(realpath -m "$3")
root=$(cd "$(dirname "$0")/.." && pwd)
wrapper=$tool
case $tool in cabpk|clusterctl) wrapper=capi ;; esac
src=$root/hack/tools/$wrapper
case $tool in
  etcd) module=go.etcd.io/etcd/server/v3 ;;
  kube) module=k8s.io/kubernetes ;;
  capi|cabpk|clusterctl) module=sigs.k8s.io/cluster-api ;;
  *) echo "unknown tool $tool (want etcd, kube, capi, cabpk or clusterctl)" >&2; exit 2 ;;
esac

if ! grep -q "$module $version\$" "$src/go.mod"; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp "$src"/*.go "$src"/go.mod "$src"/go.sum "$work"/
  [ -f "$src/gomod.sh" ] && cp "$src/gomod.sh" "$work/"
  src=$work
  echo ">> rewriting the $tool wrapper module for $module $version"
  # etcd's modules (pkg, api, client, raft) move in lockstep: an older
  # server needs their matching versions, so its go.mod starts afresh and
  # takes exactly what that server requires.
  (cd "$src" && case $tool in
     kube) rm -f go.mod go.sum; ./gomod.sh "$version" ;;
     etcd) rm -f go.mod go.sum; go mod init github.com/qcp-dev/qcp/hack/tools/etcd
           go mod edit -require="$module@$version" -require="go.etcd.io/etcd/etcdutl/v3@$version"; go mod tidy ;;
     capi|cabpk|clusterctl) go mod edit -require="$module@$version" -require="sigs.k8s.io/cluster-api/api@$version"; go mod tidy ;;
   esac)
fi

ldflags="-s -w"
target=.
case $tool in
  kube)
    minor=$(echo "$version" | cut -d. -f2)
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags="$ldflags -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
    done ;;
  capi|cabpk|clusterctl)
    target=sigs.k8s.io/cluster-api/core
    [ "$tool" = cabpk ] && target=sigs.k8s.io/cluster-api/bootstrap/kubeadm
    [ "$tool" = clusterctl ] && target=sigs.k8s.io/cluster-api/cmd/clusterctl
    ldflags="$ldflags -X sigs.k8s.io/cluster-api/version.gitVersion=$version -X sigs.k8s.io/cluster-api/version.gitTreeState=clean" ;;
esac

echo ">> building $tool $version into $out (a cold build can take minutes)"
start=$(date +%s)
# Built under a hidden name and renamed: images/install.sh takes every
# bin/kube-v* it finds, and `make test` builds one beside the tests.
tmp=$(dirname "$out")/.$(basename "$out").tmp
(cd "$src" && go build -trimpath -ldflags "$ldflags" -o "$tmp" "$target")
mv "$tmp" "$out"
echo ">> built $tool $version in $(( $(date +%s) - start ))s"
