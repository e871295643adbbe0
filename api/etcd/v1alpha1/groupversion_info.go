// Package v1alpha1 holds the EtcdCluster API: a managed external etcd
// cluster on its own CAPI machines.
// +kubebuilder:object:generate=true
// +groupName=etcd.cluster.x-k8s.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of the etcd provider.
	GroupVersion = schema.GroupVersion{Group: "etcd.cluster.x-k8s.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
