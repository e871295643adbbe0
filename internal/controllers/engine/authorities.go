package engine

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qcp-dev/qcp/internal/certs"
)

// InvalidAuthorityError is an authority's Secret that exists but cannot be
// used.
type InvalidAuthorityError struct {
	Secret, Problem string
}

func (e *InvalidAuthorityError) Error() string {
	return fmt.Sprintf("Secret %s cannot be used: %s; put the authority's PEM certificate (the service-account key's: its PEM public key) in %s and its PEM private key in %s (or delete the Secret before any machine exists, and QCP generates it)",
		e.Secret, e.Problem, secret.TLSCrtDataName, secret.TLSKeyDataName)
}

// CheckAuthoritySecret reports an authority's Secret that exists but whose
// certificate (the service-account Secret: public key) or private key is
// missing or unreadable, or whose two halves do not belong together. A
// missing Secret is fine: it is generated. CAPI's util/secret would
// otherwise generate the missing authorities beside it and fail later,
// naming nothing.
func CheckAuthoritySecret(ctx context.Context, c client.Client, cluster client.ObjectKey, purpose secret.Purpose) error {
	name := secret.Name(cluster.Name, purpose)
	var s corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, &s); err != nil {
		return client.IgnoreNotFound(err)
	}
	for _, key := range []string{secret.TLSCrtDataName, secret.TLSKeyDataName} {
		if len(s.Data[key]) == 0 {
			return &InvalidAuthorityError{Secret: name, Problem: key + " is missing or empty"}
		}
	}
	if _, err := certs.ParseAuthority(purpose, s.Data[secret.TLSCrtDataName], s.Data[secret.TLSKeyDataName]); err != nil {
		return &InvalidAuthorityError{Secret: name, Problem: err.Error()}
	}
	return nil
}

// NextPurpose and PreviousPurpose name a CA rotation's two Secrets
// (<cluster>-<purpose>-next, <cluster>-<purpose>-previous), which exist
// while the rotation runs.
func NextPurpose(p secret.Purpose) secret.Purpose     { return p + "-next" }
func PreviousPurpose(p secret.Purpose) secret.Purpose { return p + "-previous" }
