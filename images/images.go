// Package images holds the machine image recipe: install.sh puts qcp-agent
// and the pinned etcd and Kubernetes binaries into a root file system
// (README.md says what an image must hold). The process provider boots its
// machines from a tree this script installed (Install), so the recipe runs
// on every test.
package images

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/qcp-dev/qcp/internal/cloudinit"
)

//go:embed install.sh
var installScript []byte

// Install runs install.sh into destDir from binDir and the qcp-agent at
// agent, hard-linking where it can.
func Install(destDir, binDir, agent string) error {
	script, err := os.CreateTemp("", "qcp-image-install-*.sh")
	if err != nil {
		return err
	}
	defer os.Remove(script.Name())
	if _, err := script.Write(installScript); err != nil {
		script.Close()
		return err
	}
	if err := script.Close(); err != nil {
		return err
	}
	cmd := exec.Command("sh", script.Name(), binDir, agent)
	cmd.Env = append(os.Environ(), "DESTDIR="+destDir, "LINK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("installing the machine image into %s: %w: %s", destDir, err, out)
	}
	return nil
}

// Paths returns the agent and the binary directory of the tree at root:
// where the bootstrap data's unit finds them (internal/cloudinit).
func Paths(root string) (agent, binDir string) {
	return filepath.Join(root, cloudinit.AgentPath), filepath.Join(root, cloudinit.BinDir)
}
