package machinehost

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/cloudinit"
)

// A machine booted from cloud-config has a root file system: its directory.
// What the document writes goes there (/etc/qcp/bootstrap.yaml is
// <dir>/etc/qcp/bootstrap.yaml), and so does the agent's data directory,
// while the machine image's paths (the agent and the pinned binaries) are
// this host's AgentPath and BinDir. The host's own files (agent.pid,
// agent.log, its console) stay at the top of the directory.

// StartBootstrap starts the machine from a bootstrap data Secret's format
// and value: cloud-config (or no format, which CAPI's contract reads as
// cloud-config) with StartCloudConfig, the old qcp format with Start, for
// machines made before cloud-config until a rollout replaces them. Any
// other format is refused, naming it.
func (h *Host) StartBootstrap(spec MachineSpec, format string, value []byte) error {
	switch format {
	case cloudinit.Format, "":
		return h.StartCloudConfig(spec, value)
	case bootstrap.Format:
		return h.Start(spec, value)
	}
	return &Error{Reason: ReasonInvalidBootstrapData, Object: spec.Namespace + "/" + spec.Name,
		Err: fmt.Errorf("bootstrap data format %q is not one this provider runs: its bootstrap provider must write %q (or %q, for machines made before it)", format, cloudinit.Format, bootstrap.Format)}
}

// StartCloudConfig starts a machine from cloud-config bootstrap data as
// cloud-init would, and as CAPD executes it in a container: it renders the
// instance-data placeholders (the host name is the machine's name), writes
// each write_files entry under the machine's root with its mode, and runs
// runcmd, where systemctl starts the qcp-agent unit's ExecStart as the
// machine's process tree. The instance data it provides, as a cloud's
// metadata service would, holds the machine's address. It validates the
// document and that the image holds the binaries the bootstrap document
// inside it names first, and creates nothing if they fail; of that inner
// document it reads nothing else, and writes no machine.json: the agent
// reads and validates it.
func (h *Host) StartCloudConfig(spec MachineSpec, data []byte) error {
	obj := spec.Namespace + "/" + spec.Name
	dir, running, err := h.attach(spec)
	if err != nil || running {
		return err
	}
	boot, err := h.planBoot(dir, spec.Name, data)
	if err != nil {
		return &Error{Reason: ReasonInvalidBootstrapData, Object: obj, Err: fmt.Errorf("%w (fix the bootstrap data Secret)", err)}
	}
	if err := boot.doc.CheckBinaries(h.BinDir); err != nil {
		return &Error{Reason: ReasonBinaryMissing, Object: obj, Err: err}
	}
	if err := h.checkAgent(obj); err != nil {
		return err
	}
	instance, err := json.MarshalIndent(map[string]any{
		"v1": map[string]any{"local_hostname": spec.Name, "instance_id": spec.ProviderID, "availability_zone": spec.FailureDomain},
		"ds": map[string]any{"meta_data": map[string]any{"local-ipv4": spec.Address, "local-hostname": spec.Name}},
	}, "", "  ")
	if err != nil {
		return &Error{Reason: ReasonStartFailed, Object: obj, Err: err}
	}
	if err := writeRoot(dir, boot.files, instance); err != nil {
		return &Error{Reason: ReasonStartFailed, Object: obj, Err: err}
	}
	pl, err := h.machinePlace(spec)
	if err != nil {
		return err
	}
	if _, err := h.launch(dir, nil, pl, boot.argv...); err != nil {
		return &Error{Reason: ReasonStartFailed, Object: obj, Err: err}
	}
	return nil
}

// DataDir is the agent's data directory on machine namespace/name: its
// certificates, etcd's data and logs. It is the machine directory for a
// machine booted from the old qcp format.
func (h *Host) DataDir(namespace, name string) string {
	return dataDir(h.Dir(namespace, name))
}

func dataDir(dir string) string {
	inRoot := filepath.Join(dir, cloudinit.DataDir)
	if fi, err := os.Stat(inRoot); err == nil && fi.IsDir() {
		return inRoot
	}
	return dir
}

// boot is what running a cloud-config document comes to: the files to
// write (by path on the machine) and the agent's command line, mapped onto
// this host.
type boot struct {
	files []rootFile
	argv  []string
	doc   *bootstrap.Document
}

type rootFile struct {
	path string
	mode os.FileMode
	data []byte
}

// planBoot reads the document and works out what running it does, without
// doing any of it.
func (h *Host) planBoot(dir, hostname string, data []byte) (*boot, error) {
	cfg, err := cloudinit.Parse(data, map[string]string{cloudinit.HostnameKey: hostname})
	if err != nil {
		return nil, err
	}
	b := &boot{}
	written := map[string][]byte{}
	for _, f := range cfg.WriteFiles {
		content, _ := f.Decode() // Parse checked it
		mode, _ := f.Mode()
		b.files = append(b.files, rootFile{path: f.Path, mode: mode, data: content})
		written[f.Path] = content
	}
	units, err := unitsStarted(cfg.RunCmd)
	if err != nil {
		return nil, err
	}
	if len(units) != 1 {
		return nil, fmt.Errorf("runcmd starts %d units (%v); this provider runs one, %s", len(units), units, cloudinit.UnitName)
	}
	unitPath := path.Join(path.Dir(cloudinit.UnitPath), units[0])
	unit, ok := written[unitPath]
	if !ok {
		return nil, fmt.Errorf("runcmd starts %s, but no write_files entry writes %s", units[0], unitPath)
	}
	argv, err := execStart(unitPath, unit)
	if err != nil {
		return nil, err
	}
	if argv[0] != cloudinit.AgentPath || len(argv) < 2 || argv[1] != "run" {
		return nil, fmt.Errorf("%s starts %q; this provider runs `%s run` only", unitPath, argv[0], cloudinit.AgentPath)
	}
	bootstrapPath := flagValue(argv, "--bootstrap-file")
	doc, ok := written[bootstrapPath]
	if !ok {
		return nil, fmt.Errorf("the unit's --bootstrap-file %q is not among the files the document writes", bootstrapPath)
	}
	// The provider reads what the document asks of the image, not its
	// key material: the agent validates the rest, and a fault there is
	// the agent's to report (the machine's status).
	b.doc = bootstrap.RequiredBinaries(doc)
	image := map[string]string{cloudinit.AgentPath: h.AgentPath, cloudinit.BinDir: h.BinDir}
	for i, arg := range argv {
		name, value, isFlag := strings.Cut(arg, "=")
		if !isFlag {
			name, value = "", arg
		}
		if !path.IsAbs(value) {
			continue
		}
		mapped, ok := image[value]
		if !ok {
			mapped = filepath.Join(dir, filepath.FromSlash(value))
		}
		if isFlag {
			mapped = name + "=" + mapped
		}
		argv[i] = mapped
	}
	// launch runs the agent binary itself; argv[0] is the host's.
	b.argv = argv[1:]
	return b, nil
}

// unitsStarted reads runcmd as the process provider runs it: systemctl
// daemon-reload does nothing here, enable --now and start start units,
// and any other command is refused, since a provider that skipped it
// would boot a machine other than the one asked for.
func unitsStarted(cmds [][]string) ([]string, error) {
	var units []string
	for _, argv := range cmds {
		if argv[0] != "systemctl" || len(argv) < 2 {
			return nil, fmt.Errorf("runcmd %q: this provider runs systemctl daemon-reload, enable --now and start only", strings.Join(argv, " "))
		}
		switch verb, args := argv[1], argv[2:]; {
		case verb == "daemon-reload" && len(args) == 0:
		case verb == "start" && len(args) > 0:
			units = append(units, args...)
		case verb == "enable" && slices.Contains(args, "--now"):
			units = append(units, slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--now" })...)
		default:
			return nil, fmt.Errorf("runcmd %q: this provider runs systemctl daemon-reload, enable --now and start only", strings.Join(argv, " "))
		}
	}
	return units, nil
}

// execStart is the unit's ExecStart command line, split at spaces.
func execStart(unitPath string, unit []byte) ([]string, error) {
	var argv []string
	for _, line := range strings.Split(string(unit), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "ExecStart="); ok {
			if argv != nil {
				return nil, fmt.Errorf("%s has more than one ExecStart", unitPath)
			}
			if strings.ContainsAny(rest, `"'\`) {
				return nil, fmt.Errorf("%s: ExecStart quotes or escapes an argument, which this provider does not read", unitPath)
			}
			argv = strings.Fields(rest)
		}
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("%s has no ExecStart", unitPath)
	}
	return argv, nil
}

// flagValue is the value of --name=value in argv, or "".
func flagValue(argv []string, name string) string {
	for _, a := range argv {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// writeRoot lays out the machine's root file system: the document's files,
// cloud-init's instance data, and the agent's data directory.
func writeRoot(dir string, files []rootFile, instance []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files = append(files,
		rootFile{path: cloudinit.InstanceDataPath, mode: 0o600, data: instance})
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return err
		}
		// WriteFile keeps the mode of a file that existed; a machine
		// started again must not keep a wider one.
		if err := os.Chmod(p, f.mode); err != nil {
			return err
		}
	}
	return errors.Join(os.MkdirAll(filepath.Join(dir, cloudinit.DataDir), 0o700), os.Chmod(dir, 0o700))
}
