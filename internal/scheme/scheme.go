// Package scheme builds the runtime scheme every QCP binary and test uses.
package scheme

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
)

// New returns a scheme with the Kubernetes, CAPI core and QCP types.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, clusterv1.AddToScheme,
		controlplanev1.AddToScheme, etcdv1.AddToScheme, infrav1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(fmt.Sprintf("building scheme: %v", err)) // programming error: types conflict
		}
	}
	return s
}
