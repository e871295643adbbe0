package localenv

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestManagerForbiddenKeepsOnlyMissingPermissions: of the refusals in a
// manager's log (JSON, as qcp-manager writes it), the check keeps those the
// bound roles do not grant, and one that names no request, and leaves out
// one the roles grant (an API server that had just restarted).
func TestManagerForbiddenKeepsOnlyMissingPermissions(t *testing.T) {
	roles, err := ManagerRoles()
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{Dir: t.TempDir(), managerRoles: roles}
	refused := func(what string) string {
		return `{"level":"error","msg":"Reconciler error","error":"failed to list machines: machines.cluster.x-k8s.io is forbidden: User \"system:serviceaccount:qcp-system:qcp-manager\" ` + what + `"}`
	}
	granted := refused(`cannot list resource \"machines\" in API group \"cluster.x-k8s.io\" in the namespace \"default\"`)
	missing := refused(`cannot create resource \"nodes\" in API group \"\" at the cluster scope`)
	subresource := refused(`cannot update resource \"clusters/status\" in API group \"cluster.x-k8s.io\" in the namespace \"default\"`)
	unnamed := refused(`no reason given`)
	other := `{"level":"error","msg":"x is forbidden: User \"system:serviceaccount:other:sa\" cannot create resource \"nodes\" in API group \"\""}`
	log := granted + "\n" + missing + "\n" + subresource + "\n" + unnamed + "\n" + other + "\n"
	if err := os.WriteFile(filepath.Join(e.Dir, "qcp-manager.log"), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	found, err := e.ManagerForbidden()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"qcp-manager.log: " + missing, "qcp-manager.log: " + subresource, "qcp-manager.log: " + unnamed}
	if len(found) != len(want) {
		t.Fatalf("found %d lines, want %d:\n%q", len(found), len(want), found)
	}
	for i := range want {
		if found[i] != want[i] {
			t.Errorf("line %d: %q, want %q", i, found[i], want[i])
		}
	}
	// CAPI core, run as the release's ServiceAccount, is checked against
	// the roles bound to that ServiceAccount.
	e.capiIdentities = map[string]managerIdentity{"capi-manager": {user: "system:serviceaccount:capi-system:capi-manager", roles: roles}}
	capiRefused := func(what string) string {
		return `E1129 reflector.go:1 "Unhandled Error" err="etcdclusters.etcd.cluster.x-k8s.io is forbidden: User \"system:serviceaccount:capi-system:capi-manager\" ` + what + `"`
	}
	capiMissing := capiRefused(`cannot list resource \"nodes\" in API group \"\" at the cluster scope`)
	capiLog := capiRefused(`cannot list resource \"machines\" in API group \"cluster.x-k8s.io\" at the cluster scope`) + "\n" + capiMissing + "\n" + other + "\n"
	if err := os.WriteFile(filepath.Join(e.Dir, "capi-manager.log"), []byte(capiLog), 0o600); err != nil {
		t.Fatal(err)
	}
	if found, err = e.ManagerForbidden(); err != nil {
		t.Fatal(err)
	}
	if want = append([]string{"capi-manager.log: " + capiMissing}, want...); !slices.Equal(found, want) {
		t.Errorf("with CAPI core's log: found %q, want %q", found, want)
	}
	if !Grants(roles, "get", "apiextensions.k8s.io", "customresourcedefinitions") {
		t.Error("the release's roles do not grant reading CustomResourceDefinitions, which CAPI's contract helpers need")
	}
}
