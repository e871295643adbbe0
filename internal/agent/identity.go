package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
)

// HostAddress is the machine's IPv4 address as the machine itself knows it:
// the local IPv4 address in cloud-init's instance data (instanceData, its
// instance-data.json; the metadata service of EC2, OpenStack and the
// process provider carry it), else the first IPv4 address of an interface
// that is up and not loopback, as kubeadm picks its advertise address.
func HostAddress(instanceData string) (string, error) {
	if instanceData != "" {
		addr, err := instanceAddress(instanceData)
		if err != nil {
			return "", err
		}
		if addr != "" {
			return addr, nil
		}
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("listing network interfaces: %w", err)
	}
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String(), nil
			}
		}
	}
	return "", errors.New("no address: the instance data names none and no interface that is up has an IPv4 address; pass --address")
}

// instanceAddress reads the local IPv4 address from instance-data.json;
// "" when the file or the key is absent.
func instanceAddress(path string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading instance data: %w", err)
	}
	var doc struct {
		DS struct {
			MetaData map[string]any `json:"meta_data"`
		} `json:"ds"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return "", fmt.Errorf("instance data %s is not JSON: %w", path, err)
	}
	for _, key := range []string{"local-ipv4", "local_ipv4"} {
		if s, ok := doc.DS.MetaData[key].(string); ok && s != "" {
			if ip := net.ParseIP(s); ip == nil || ip.To4() == nil {
				return "", fmt.Errorf("instance data %s: ds.meta_data.%s %q is not an IPv4 address", path, key, s)
			}
			return s, nil
		}
	}
	return "", nil
}
