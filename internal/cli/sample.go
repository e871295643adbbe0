package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	capiyaml "sigs.k8s.io/cluster-api/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/config"
)

// The sample cluster (config/samples/demo.yaml).
const (
	sampleFile         = "samples/demo.yaml"
	sampleCluster      = "demo"
	sampleControlPlane = "demo-control-plane"
	sampleNamespace    = "default"
	sampleReplicas     = 3
)

// applySample creates every object of the sample manifest.
func applySample(ctx context.Context, c client.Client) error {
	data, err := config.Manifests.ReadFile(sampleFile)
	if err != nil {
		return err
	}
	objs, err := capiyaml.ToUnstructured(data)
	if err != nil {
		return fmt.Errorf("reading %s: %w", sampleFile, err)
	}
	for i := range objs {
		if err := c.Create(ctx, &objs[i]); err != nil {
			return fmt.Errorf("creating %s %s from %s: %w", objs[i].GetKind(), objs[i].GetName(), sampleFile, err)
		}
	}
	return nil
}

// waitForSample prints the sample control plane's progress, a line each
// time what it does changes, until it is Available with every machine a
// voter.
func waitForSample(ctx context.Context, out io.Writer, c client.Client, start time.Time) error {
	last := ""
	for {
		cp := &controlplanev1.QuorumControlPlane{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: sampleNamespace, Name: sampleControlPlane}, cp); err != nil {
			return err
		}
		voters, learners := 0, 0
		for _, m := range cp.Status.Etcd.Members {
			if m.Role == controlplanev1.EtcdMemberRoleLearner {
				learners++
			} else {
				voters++
			}
		}
		op := cp.Status.LastOperation
		line := fmt.Sprintf("%d/%d machines, %d etcd voters, %d learners", ptr.Deref(cp.Status.Replicas, 0), sampleReplicas, voters, learners)
		if op.Kind != "" {
			line += "; " + strings.TrimSpace(string(op.Kind)+" "+op.Target) + ": " + op.Reason
		}
		if line != last {
			fmt.Fprintf(out, "  [%5.1fs] %s\n", time.Since(start).Seconds(), line)
			last = line
		}
		if conditions.IsTrue(cp, controlplanev1.AvailableCondition) && voters == sampleReplicas && learners == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
