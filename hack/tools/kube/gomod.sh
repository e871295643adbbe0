#!/usr/bin/env bash
# Writes go.mod for the kube wrapper at Kubernetes version $1 (e.g. v1.36.3):
# k8s.io/kubernetes at that version, with every staging module it replaces
# locally pinned to the matching v0.x.y release, so the build needs only the
# Go module proxy.
set -euo pipefail
version=$1
staging=v0.${version#v1.}
go mod init github.com/qcp-dev/qcp/hack/tools/kube >/dev/null 2>&1 || true
go mod edit -go=1.26 -require=k8s.io/kubernetes@"$version"
kmod=$(go mod download -json k8s.io/kubernetes@"$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
for m in $(awk '/=> .\/staging/ {print $1}' "$kmod"); do
  go mod edit -replace="$m=$m@$staging"
done
go mod tidy
