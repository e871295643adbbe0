// Package tools pins the cluster-api module so that `go build
// sigs.k8s.io/cluster-api/core` (CAPI core's manager) and `go build
// sigs.k8s.io/cluster-api/bootstrap/kubeadm` (its kubeadm bootstrap
// provider, CABPK) build them from this wrapper.
//go:build tools

package tools

import (
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/core"
)
