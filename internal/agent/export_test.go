package agent

import (
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/qcp-dev/qcp/internal/bootstrap"
)

// NodeAgentForTest runs the Node heartbeat of a machine whose components'
// states the test sets, through a client the test gives.
type NodeAgentForTest struct{ *nodeAgent }

// NewNodeAgentForTest returns the heartbeat of Node name, for a machine that
// runs components, writing the status every refresh when nothing changes.
func NewNodeAgentForTest(c kubernetes.Interface, name string, components []bootstrap.Component, refresh time.Duration) NodeAgentForTest {
	a := &machineCtx{
		machine: Machine{Name: name, Address: "127.0.0.1"},
		doc:     &bootstrap.Document{Components: components},
		log:     slog.Default(),
		sup:     newSupervisor("", slog.Default(), 0),
		prober:  &prober{rounds: make(chan struct{}, 1), probes: map[bootstrap.Component]Probe{}},
	}
	clients := []kubernetes.Interface{c}
	return NodeAgentForTest{&nodeAgent{a: a, clients: clients, admin: clients, refresh: refresh}}
}

// SetHealth records c as running or not and its probe as passing or not,
// then ends the probe round, as the supervisor and the prober do.
func (n NodeAgentForTest) SetHealth(c bootstrap.Component, running, probeOK bool) {
	n.a.sup.update(c, func(st *ComponentState) { st.Running = running })
	pr := Probe{OK: probeOK, Time: time.Now()}
	if !probeOK {
		pr.Error = "connection refused"
	}
	n.a.prober.set(c, pr)
	n.a.prober.roundDone()
}
