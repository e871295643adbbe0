package webhooks_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/webhooks"
)

const templateWebhook = `admission webhook "validation.quorumcontrolplanetemplate.controlplane.cluster.x-k8s.io" denied the request`

// templateOf is the QuorumControlPlaneTemplate that carries q's config and
// machine settings, and nothing the topology controller sets.
func templateOf(q *controlplanev1.QuorumControlPlane) *controlplanev1.QuorumControlPlaneTemplate {
	return &controlplanev1.QuorumControlPlaneTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: q.Name},
		Spec: controlplanev1.QuorumControlPlaneTemplateSpec{Template: controlplanev1.QuorumControlPlaneTemplateResource{
			Spec: controlplanev1.QuorumControlPlaneTemplateResourceSpec{
				QuorumControlPlaneConfig: q.Spec.QuorumControlPlaneConfig,
				MachineTemplate: controlplanev1.QuorumControlPlaneTemplateMachineTemplate{
					ObjectMeta: q.Spec.MachineTemplate.ObjectMeta,
					Spec: controlplanev1.QuorumControlPlaneTemplateMachineTemplateSpec{
						QuorumControlPlaneMachineSettings: q.Spec.MachineTemplate.Spec.QuorumControlPlaneMachineSettings,
					},
				},
			},
		}},
	}
}

// templateCase is a template request and the rejection it must get, if any.
type templateCase struct {
	name       string
	tmpl       *controlplanev1.QuorumControlPlaneTemplate
	field, fix string
}

// templateCases: every create case of the QuorumControlPlane, carried by a
// template. One refused on a field the template carries must be refused
// on the same field under spec.template.spec with the same message (the
// other fields it refuses on are the topology's, and the template leaves
// them out). Then the fields the topology controller owns.
func templateCases() []templateCase {
	var cases []templateCase
	for _, tc := range admissionCases() {
		if tc.old != nil || tc.pureOnly {
			continue
		}
		c := templateCase{name: "as the object: " + tc.name, tmpl: templateOf(tc.new)}
		// A template carries no certificate operation, no backups, no
		// restore and no quorum-loss policy: they belong to one cluster.
		if rest, ok := strings.CutPrefix(tc.field, "spec."); ok && !topologyOwned(rest) && !strings.HasPrefix(rest, "certificates.") &&
			!strings.HasPrefix(rest, "backup") && !strings.HasPrefix(rest, "restore") &&
			!strings.HasPrefix(rest, "quorumLossRecovery") {
			c.field = "spec.template.spec." + rest
			c.fix = strings.ReplaceAll(tc.fix, "set spec.", "set spec.template.spec.")
		}
		cases = append(cases, c)
	}
	withSpec := func(edit func(*controlplanev1.QuorumControlPlaneTemplateResourceSpec)) *controlplanev1.QuorumControlPlaneTemplate {
		t := templateOf(qcp())
		edit(&t.Spec.Template.Spec)
		return t
	}
	return append(cases,
		templateCase{name: "replicas", tmpl: withSpec(func(s *controlplanev1.QuorumControlPlaneTemplateResourceSpec) { s.Replicas = ptr.To[int32](3) }),
			field: "spec.template.spec.replicas", fix: "comes from the Cluster's spec.topology.controlPlane.replicas; remove it from the template"},
		templateCase{name: "version", tmpl: withSpec(func(s *controlplanev1.QuorumControlPlaneTemplateResourceSpec) { s.Version = "v1.36.3" }),
			field: "spec.template.spec.version", fix: "comes from the Cluster's spec.topology.version; remove it from the template"},
		templateCase{name: "infrastructureRef", tmpl: withSpec(func(s *controlplanev1.QuorumControlPlaneTemplateResourceSpec) {
			s.MachineTemplate.Spec.InfrastructureRef = &clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachineTemplate", Name: "cp"}
		}), field: "spec.template.spec.machineTemplate.spec.infrastructureRef",
			fix: "comes from the ClusterClass's spec.controlPlane.machineInfrastructure.templateRef"},
		templateCase{name: "maxSurge 0, which only the Cluster's replicas can judge", tmpl: withSpec(func(s *controlplanev1.QuorumControlPlaneTemplateResourceSpec) {
			s.Rollout.Strategy.RollingUpdate.MaxSurge = ptr.To[int32](0)
		})},
		templateCase{name: "readiness gates and taints", tmpl: withSpec(func(s *controlplanev1.QuorumControlPlaneTemplateResourceSpec) {
			s.MachineTemplate.Spec.ReadinessGates = []clusterv1.MachineReadinessGate{{ConditionType: "example.com/Ready"}}
			s.MachineTemplate.Spec.Taints = []clusterv1.MachineTaint{{Key: "example.com/dedicated", Effect: "NoSchedule", Propagation: clusterv1.MachineTaintPropagationAlways}}
		})},
	)
}

// topologyOwned reports whether a QuorumControlPlane's field (its path under
// spec) is set by the topology controller or judged against one it sets.
func topologyOwned(field string) bool {
	return field == "replicas" || field == "version" || strings.HasPrefix(field, "rollout.strategy.rollingUpdate.maxSurge")
}

// TestValidateTemplate runs templateCases against the pure rules.
func TestValidateTemplate(t *testing.T) {
	for _, tc := range templateCases() {
		t.Run(tc.name, func(t *testing.T) {
			errs := webhooks.ValidateTemplate(nil, tc.tmpl)
			if tc.field == "" {
				if len(errs) != 0 {
					t.Fatalf("refused a valid template: %v", errs)
				}
				return
			}
			if len(errs) != 1 || errs[0].Field != tc.field || !strings.Contains(errs[0].Error(), tc.fix) {
				t.Errorf("errors %v; want one on %s saying %q", errs, tc.field, tc.fix)
			}
		})
	}
}

// testTemplateAdmission sends templateCases through the API server, then
// changes: a template's spec is fixed once stored, its labels are not. A
// ProcessClusterTemplate is refused an endpoint and a changed spec by its
// schema.
func testTemplateAdmission(ctx context.Context, t *testing.T, c client.Client) {
	for i, tc := range templateCases() {
		t.Run(tc.name, func(t *testing.T) {
			obj := tc.tmpl.DeepCopy()
			obj.Name = fmt.Sprintf("template-%02d", i)
			err := c.Create(ctx, obj)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("rejected a valid template: %v", err)
				}
				got := &controlplanev1.QuorumControlPlaneTemplate{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
					t.Fatal(err)
				}
				if !equality.Semantic.DeepEqual(got.Spec, tc.tmpl.Spec) {
					t.Errorf("stored spec\n%+v\nwant it as sent (a template is not defaulted)\n%+v", got.Spec, tc.tmpl.Spec)
				}
				return
			}
			checkRejected(t, err, templateWebhook, tc.field, tc.fix)
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &controlplanev1.QuorumControlPlaneTemplate{}); !apierrors.IsNotFound(err) {
				t.Errorf("a rejected template was stored: %v", err)
			}
		})
	}

	t.Run("a stored template's spec cannot change, its labels can", func(t *testing.T) {
		tmpl := templateOf(qcp())
		tmpl.Name = "fixed"
		if err := c.Create(ctx, tmpl); err != nil {
			t.Fatal(err)
		}
		changed := tmpl.DeepCopy()
		changed.Spec.Template.Spec.APIServer.CertSANs = []string{"api.example.com"}
		checkRejected(t, c.Update(ctx, changed), templateWebhook, "spec",
			"create a new template and point the ClusterClass's spec.controlPlane.templateRef at it")
		labelled := tmpl.DeepCopy()
		labelled.Labels = map[string]string{"team": "a"}
		if err := c.Update(ctx, labelled); err != nil {
			t.Errorf("a label change was refused: %v", err)
		}
	})

	t.Run("ProcessClusterTemplate", func(t *testing.T) {
		withEndpoint := &infrav1.ProcessClusterTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "endpoint"},
			Spec: infrav1.ProcessClusterTemplateSpec{Template: infrav1.ProcessClusterTemplateResource{Spec: infrav1.ProcessClusterSpec{
				ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "127.0.0.1", Port: 6443}}}}}
		err := c.Create(ctx, withEndpoint)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.template.spec") ||
			!strings.Contains(err.Error(), "each ProcessCluster gets a load balancer address of its own") {
			t.Errorf("want the endpoint refused, naming spec.template.spec.controlPlaneEndpoint and the fix; got %v", err)
		}
		tmpl := &infrav1.ProcessClusterTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "domains"},
			Spec: infrav1.ProcessClusterTemplateSpec{Template: infrav1.ProcessClusterTemplateResource{Spec: infrav1.ProcessClusterSpec{
				FailureDomains: []string{"fd-a", "fd-b", "fd-c"}}}}}
		if err := c.Create(ctx, tmpl); err != nil {
			t.Fatalf("a valid ProcessClusterTemplate was refused: %v", err)
		}
		changed := tmpl.DeepCopy()
		changed.Spec.Template.Spec.FailureDomains = []string{"fd-a"}
		err = c.Update(ctx, changed)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "point the ClusterClass's spec.infrastructure.templateRef at it") {
			t.Errorf("want the spec change refused with the fix; got %v", err)
		}
	})
}
