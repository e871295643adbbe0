package testkit

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/qcp-dev/qcp/internal/etcd"
)

// RaiseAlarm raises alarm typ on behalf of member, as etcd does when that
// member runs out of space (NOSPACE) or finds its data differs (CORRUPT).
// The client API only lists and disarms alarms, so this goes through the
// maintenance service's raw Alarm call.
func RaiseAlarm(ctx context.Context, cli *etcd.Client, member uint64, typ etcdserverpb.AlarmType) error {
	req := &etcdserverpb.AlarmRequest{Action: etcdserverpb.AlarmRequest_ACTIVATE, MemberID: member, Alarm: typ}
	if _, err := etcdserverpb.NewMaintenanceClient(cli.Raw().ActiveConnection()).Alarm(ctx, req); err != nil {
		return fmt.Errorf("raising %s on member %x: %w", typ, member, err)
	}
	return nil
}
