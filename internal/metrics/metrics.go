// Package metrics registers QCP's Prometheus collectors with
// controller-runtime's registry, which qcp-manager's metrics endpoint
// serves.
package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// RegisterOrReuse registers c, or returns the collector of the same
// description registered first (another Setup in the same process, such as
// a test that sets up a controller twice).
func RegisterOrReuse[C prometheus.Collector](c C) C {
	if err := crmetrics.Registry.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
