// Package tools pins the CAPI core manager module so that
// `go build sigs.k8s.io/cluster-api/core` builds it from this wrapper.
//go:build tools

package tools

import _ "sigs.k8s.io/cluster-api/core"
