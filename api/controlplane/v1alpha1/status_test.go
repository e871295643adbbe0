package v1alpha1_test

import (
	"slices"
	"testing"

	"sigs.k8s.io/yaml"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/config"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// The reconciler records a quorum.Decision's kind as an OperationKind; a kind
// the CRD's enum lacks would make every status update fail.
func TestOperationKindsMatchQuorumKindsAndCRDEnum(t *testing.T) {
	kinds := map[quorum.Kind]controlplanev1.OperationKind{
		quorum.CreateMachine:     controlplanev1.OperationCreateMachine,
		quorum.AddLearner:        controlplanev1.OperationAddLearner,
		quorum.Promote:           controlplanev1.OperationPromote,
		quorum.MoveLeader:        controlplanev1.OperationMoveLeader,
		quorum.RemoveMember:      controlplanev1.OperationRemoveMember,
		quorum.AddHook:           controlplanev1.OperationAddHook,
		quorum.RemoveHook:        controlplanev1.OperationRemoveHook,
		quorum.DeleteMachine:     controlplanev1.OperationDeleteMachine,
		quorum.DisarmAlarm:       controlplanev1.OperationDisarmAlarm,
		quorum.Defragment:        controlplanev1.OperationDefragment,
		quorum.Compact:           controlplanev1.OperationCompact,
		quorum.RestartMember:     controlplanev1.OperationRestartMember,
		quorum.RenewCertificates: controlplanev1.OperationRenewCertificates,
		quorum.SetAuthority:      controlplanev1.OperationSetAuthority,
		quorum.Snapshot:          controlplanev1.OperationSnapshot,
		quorum.Recover:           controlplanev1.OperationRecover,
		quorum.RestoreFromBackup: controlplanev1.OperationRestoreFromBackup,
		quorum.Wait:              controlplanev1.OperationWait,
		quorum.Degraded:          controlplanev1.OperationDegraded,
	}
	for _, k := range quorum.Kinds {
		if _, ok := kinds[k]; !ok {
			t.Errorf("quorum kind %q has no OperationKind; add one, and add it to the CRD's enum", k)
		}
	}
	enum := crdEnum(t, "status", "lastOperation", "kind")
	for k, op := range kinds {
		if string(k) != string(op) {
			t.Errorf("quorum kind %q is recorded as %q; make the OperationKind constant equal", k, op)
		}
		if !slices.Contains(enum, string(op)) {
			t.Errorf("the CRD's enum for status.lastOperation.kind %v lacks %q; add it to the +kubebuilder:validation:Enum marker", enum, op)
		}
	}
	if len(enum) != len(kinds) {
		t.Errorf("the CRD's enum %v has %d kinds, the quorum engine %d", enum, len(enum), len(kinds))
	}
}

// crdEnum returns the enum of the QuorumControlPlane schema property at path.
func crdEnum(t *testing.T, path ...string) []string {
	t.Helper()
	data, err := config.Manifests.ReadFile("crd/bases/controlplane.cluster.x-k8s.io_quorumcontrolplanes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema schema `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	s := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	for _, p := range path {
		next, ok := s.Properties[p]
		if !ok {
			t.Fatalf("the CRD schema has no property %v", path)
		}
		s = next
	}
	return s.Enum
}

type schema struct {
	Properties map[string]schema `json:"properties"`
	Enum       []string          `json:"enum"`
}
