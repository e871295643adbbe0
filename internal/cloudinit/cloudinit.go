// Package cloudinit is QCP's bootstrap data in the format every Cluster API
// infrastructure provider hands a machine: a #cloud-config document for
// cloud-init. Build writes it around a machine's bootstrap document; Parse
// reads one back the way a provider that executes cloud-config itself (the
// process provider, like CAPD) must: render the instance-data placeholders,
// then decode write_files and runcmd, refusing what it cannot carry out
// with an error that names the line.
//
// The document writes three files and starts one unit:
//
//   - BootstrapPath: the agent's bootstrap document, gzip+base64, 0600
//     root:root (it holds the cluster's private keys);
//   - UnitPath: the qcp-agent systemd unit;
//   - runcmd: systemctl daemon-reload, then enable --now the unit.
//
// The machine's own facts come from cloud-init's standardized instance
// data (Placeholders), under a "## template: jinja" header, as CAPI's
// kubeadm bootstrap provider does.
package cloudinit

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"
)

// Format is the bootstrap data Secret's "format" key for this document
// (CAPI's bootstrap data contract; an absent key means the same).
const Format = "cloud-config"

// Where the document puts QCP on the machine. The machine image provides
// AgentPath and BinDir (see images/); the document provides the rest.
const (
	BootstrapPath = "/etc/qcp/bootstrap.yaml"
	UnitName      = "qcp-agent.service"
	UnitPath      = "/etc/systemd/system/" + UnitName
	AgentPath     = "/usr/local/bin/qcp-agent"
	BinDir        = "/opt/qcp/bin"
	DataDir       = "/var/lib/qcp"
	// InstanceDataPath is where cloud-init keeps the instance data; the
	// agent reads the machine's address there.
	InstanceDataPath = "/run/cloud-init/instance-data.json"
)

// The document's first lines: cloud-init renders the jinja placeholders
// before it reads the YAML.
const (
	jinjaHeader = "## template: jinja"
	configLine  = "#cloud-config"
)

// Placeholders are the instance-data keys the document uses, each written
// as {{ key }}. A provider that renders the document itself substitutes
// exactly these; the process provider does.
var Placeholders = []string{HostnameKey}

// HostnameKey is the machine's host name, which names its Node, as
// kubeadm's does.
const HostnameKey = "v1.local_hostname"

// File is one write_files entry, as cloud-init's cc_write_files reads it.
type File struct {
	Path        string `json:"path"`
	Owner       string `json:"owner,omitempty"`
	Permissions string `json:"permissions,omitempty"`
	Encoding    string `json:"encoding,omitempty"`
	Content     string `json:"content"`
}

// Config is the part of a #cloud-config document QCP writes and reads.
type Config struct {
	WriteFiles []File     `json:"write_files" yaml:"write_files"`
	RunCmd     [][]string `json:"runcmd" yaml:"runcmd"`
}

// gzipBase64 is cloud-init's name for gzip-compressed, base64-encoded
// content; it also reads gz+b64 and gzip+b64.
const gzipBase64 = "gzip+base64"

// Build returns the cloud-config bootstrap data that installs doc (a
// MachineBootstrap document) and starts qcp-agent on it.
func Build(doc []byte) ([]byte, error) {
	packed, err := pack(doc)
	if err != nil {
		return nil, err
	}
	cfg := Config{
		WriteFiles: []File{
			{Path: BootstrapPath, Owner: "root:root", Permissions: "0600", Encoding: gzipBase64, Content: packed},
			{Path: UnitPath, Owner: "root:root", Permissions: "0644", Content: unit()},
		},
		RunCmd: [][]string{
			{"systemctl", "daemon-reload"},
			{"systemctl", "enable", "--now", UnitName},
		},
	}
	body, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return append([]byte(jinjaHeader+"\n"+configLine+"\n"), body...), nil
}

// unit is the qcp-agent systemd unit. A dead agent is restarted, as a
// kubelet's unit is; stopping the unit stops the components with it (its
// control group), so a restarted agent starts them afresh.
func unit() string {
	return strings.Join([]string{
		"[Unit]",
		"Description=QCP agent: this machine's etcd member and control plane components",
		"Wants=network-online.target",
		"After=network-online.target",
		"",
		"[Service]",
		fmt.Sprintf("ExecStart=%s run --dir=%s --bootstrap-file=%s --bin-dir=%s --instance-data=%s --node-name={{ %s }}",
			AgentPath, DataDir, BootstrapPath, BinDir, InstanceDataPath, HostnameKey),
		"Restart=always",
		"RestartSec=5",
		"",
		"[Install]",
		"WantedBy=multi-user.target",
		"",
	}, "\n")
}

func pack(data []byte) (string, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return "", err
	}
	if _, err := zw.Write(data); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes()), nil
}
