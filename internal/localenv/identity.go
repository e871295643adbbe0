package localenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/yaml"

	"github.com/qcp-dev/qcp/config"
)

// qcp-manager runs as a ServiceAccount bound to the roles the release
// installs, never as an administrator, so that a permission the release
// forgets fails the tests (issue 30). One process runs both providers'
// controllers here, where the release runs two Deployments, so its one
// ServiceAccount is bound to both providers' generated roles.
const (
	ManagerNamespace      = "qcp-system"
	ManagerServiceAccount = "qcp-manager"
	// managerTokenLifetime is asked of the TokenRequest API: a local
	// environment lives for a test run or a `qcpctl up` session.
	managerTokenLifetime = 365 * 24 * 60 * 60
)

// managerRoleFiles are the roles controller-gen generates from each
// provider's RBAC markers (`make generate`), which the release packages.
var managerRoleFiles = map[string]string{
	"qcp-local-control-plane-manager":          "rbac/controlplane/role.yaml",
	"qcp-local-infrastructure-process-manager": "rbac/process/role.yaml",
}

// ManagerRoles are the release's ClusterRoles for qcp-manager's controllers,
// named for the local environment.
func ManagerRoles() ([]rbacv1.ClusterRole, error) {
	var roles []rbacv1.ClusterRole
	for name, file := range managerRoleFiles {
		var role rbacv1.ClusterRole
		if err := readManifest(file, &role); err != nil {
			return nil, err
		}
		role.ObjectMeta = metav1.ObjectMeta{Name: name}
		roles = append(roles, role)
	}
	return roles, nil
}

func readManifest(file string, into any) error {
	data, err := config.Manifests.ReadFile(file)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// managerKubeconfig binds qcp-manager's ServiceAccount to roles (the
// release's, or a test's edited copy) and to the release's leader-election
// Role, and writes a kubeconfig that authenticates as that ServiceAccount
// with a token from the TokenRequest API. It returns the kubeconfig's path.
func (e *Env) managerKubeconfig(ctx context.Context, roles []rbacv1.ClusterRole) (string, error) {
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ManagerServiceAccount, Namespace: ManagerNamespace}},
	}
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: ManagerServiceAccount, Namespace: ManagerNamespace}
	for i := range roles {
		objs = append(objs, &roles[i], &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: roles[i].Name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roles[i].Name},
			Subjects:   []rbacv1.Subject{subject},
		})
	}
	var election rbacv1.Role
	if err := readManifest("rbac/common/leader_election_role.yaml", &election); err != nil {
		return "", err
	}
	election.ObjectMeta = metav1.ObjectMeta{Name: "qcp-local-leader-election", Namespace: ManagerNamespace}
	objs = append(objs, &election, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: election.Name, Namespace: ManagerNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: election.Name},
		Subjects:   []rbacv1.Subject{subject},
	})
	for _, obj := range objs {
		if err := e.apply(ctx, obj); err != nil {
			return "", fmt.Errorf("installing qcp-manager's identity: %w", err)
		}
	}
	e.managerRoles = roles
	return e.serviceAccountKubeconfig(ctx, ManagerNamespace, ManagerServiceAccount, "qcp-manager")
}

// serviceAccountKubeconfig writes <base>.kubeconfig in the environment's
// directory: it authenticates as the ServiceAccount namespace/name with a
// token from the TokenRequest API, kept in <base>.token (mode 0600), which
// client-go re-reads. It returns the kubeconfig's path.
func (e *Env) serviceAccountKubeconfig(ctx context.Context, namespace, name, base string) (string, error) {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](managerTokenLifetime)}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	tokenFile := filepath.Join(e.Dir, base+".token")
	if err := os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600); err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: e.Config.Host, CertificateAuthorityData: e.Config.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{TokenFile: tokenFile}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: name}
	kc.CurrentContext = "local"
	path := filepath.Join(e.Dir, base+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", err
	}
	return path, os.Chmod(path, 0o600)
}

// apply creates obj, or replaces what an earlier start installed under its
// name: a test's edited role is put back by the next start without one.
func (e *Env) apply(ctx context.Context, obj client.Object) error {
	desired := obj.DeepCopyObject().(client.Object)
	_, err := controllerutil.CreateOrUpdate(ctx, e.Client, obj, func() error {
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			o.Rules = desired.(*rbacv1.ClusterRole).Rules
		case *rbacv1.Role:
			o.Rules = desired.(*rbacv1.Role).Rules
		}
		return nil
	})
	return err
}

// A request RBAC refused the manager is logged with both marks (the log
// is JSON, so the quotes around the user are escaped), and says what was
// refused: `cannot <verb> resource \"<resource>\" in API group \"<group>\"`.
const (
	forbiddenMark = " is forbidden: User "
	managerUser   = "system:serviceaccount:" + ManagerNamespace + ":" + ManagerServiceAccount
)

var refusedRequest = regexp.MustCompile(`cannot (\S+) resource \\*"([^"\\]+)\\*" in API group \\*"([^"\\]*)\\*"`)

// managerIdentity is a manager that runs as a ServiceAccount: the user
// its requests are made as, and the ClusterRoles bound to it.
type managerIdentity struct {
	user  string
	roles []rbacv1.ClusterRole
	// namespace and serviceAccount, if set, name the ServiceAccount whose
	// bound roles are read again when the logs are checked: a provider
	// installed later (a test's infrastructure kind) may have added rules
	// to an aggregated role since.
	namespace, serviceAccount string
}

// ManagerForbidden returns the lines of every manager log in the
// environment's directory (qcp-manager's, and CAPI core's and CABPK's when
// they run as the release's ServiceAccounts) that report a refused request
// which the roles the manager's ServiceAccount is bound to do not grant:
// none, when those roles grant everything the managers asked for. A request
// the roles grant can still be refused for a moment by an API server that
// just restarted, before its authorizer has read the bindings (the chaos
// smoke restarts the management API server); that is not a missing
// permission, and is left out. A refusal that names no verb, resource and
// group is kept.
func (e *Env) ManagerForbidden() ([]string, error) {
	ids := map[string]managerIdentity{"qcp-manager": {user: managerUser, roles: e.managerRoles}}
	maps.Copy(ids, e.capiIdentities)
	var found []string
	var errs []error
	for _, base := range slices.Sorted(maps.Keys(ids)) {
		id := ids[base]
		if id.serviceAccount != "" && e.Client != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if roles, err := e.boundClusterRoles(ctx, id.namespace, id.serviceAccount); err == nil {
				id.roles = roles
			}
			cancel()
		}
		logs, err := filepath.Glob(filepath.Join(e.Dir, base+"*.log"))
		if err != nil {
			return nil, err
		}
		for _, path := range logs {
			f, err := os.Open(path)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
			for sc.Scan() {
				if l := sc.Text(); strings.Contains(l, forbiddenMark) && strings.Contains(l, id.user) && !grantedRefusal(id.roles, l) {
					found = append(found, filepath.Base(path)+": "+l)
				}
			}
			errs = append(errs, sc.Err(), f.Close())
		}
	}
	return found, errors.Join(errs...)
}

// grantedRefusal tells whether the request a log line says was refused is
// one roles grant.
func grantedRefusal(roles []rbacv1.ClusterRole, line string) bool {
	m := refusedRequest.FindStringSubmatch(line)
	return m != nil && Grants(roles, m[1], m[3], m[2])
}

// boundClusterRoles are the ClusterRoles bound to the ServiceAccount
// namespace/name, as they are now.
func (e *Env) boundClusterRoles(ctx context.Context, namespace, name string) ([]rbacv1.ClusterRole, error) {
	var bindings rbacv1.ClusterRoleBindingList
	if err := e.Client.List(ctx, &bindings); err != nil {
		return nil, err
	}
	var roles []rbacv1.ClusterRole
	for _, b := range bindings.Items {
		if b.RoleRef.Kind != "ClusterRole" || !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Namespace == namespace && s.Name == name
		}) {
			continue
		}
		var role rbacv1.ClusterRole
		if err := e.Client.Get(ctx, client.ObjectKey{Name: b.RoleRef.Name}, &role); err != nil {
			return nil, err
		}
		roles = append(roles, role)
	}
	return roles, nil
}

// Grants tells whether any rule of roles allows verb on resource (a
// "resource/subresource" too) in group.
func Grants(roles []rbacv1.ClusterRole, verb, group, resource string) bool {
	has := func(list []string, s string) bool {
		return slices.Contains(list, s) || slices.Contains(list, rbacv1.ResourceAll)
	}
	for _, role := range roles {
		for _, r := range role.Rules {
			if has(r.Verbs, verb) && has(r.APIGroups, group) && has(r.Resources, resource) {
				return true
			}
		}
	}
	return false
}
