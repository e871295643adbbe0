// Package tools pins the cluster-api module so that `go build
// sigs.k8s.io/cluster-api/core` (CAPI core's manager), `go build
// sigs.k8s.io/cluster-api/bootstrap/kubeadm` (its kubeadm bootstrap
// provider, CABPK) and `go build sigs.k8s.io/cluster-api/cmd/clusterctl`
// build them from this wrapper.
//go:build tools

package tools

import (
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
	_ "sigs.k8s.io/cluster-api/core"
)
