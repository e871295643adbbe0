package testkit

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// FreshBinDirEnv names a directory holding qcp-manager, qcp-agent and qcpctl
// built from this tree by the run that starts the tests: `make test` builds
// them before go test starts, and sets it. Tests then link to those instead
// of each linking its own (about 8 CPU-seconds for a manager and an agent).
const FreshBinDirEnv = "QCP_FRESH_BIN_DIR"

// BuildQCP puts QCP's commands (qcp-manager, qcp-agent, qcpctl), built from
// this tree, into dir, so that a test never runs a stale binary: it builds
// them, or links to the fresh ones of FreshBinDirEnv.
func BuildQCP(dir string, commands ...string) error {
	if fresh := os.Getenv(FreshBinDirEnv); fresh != "" {
		for _, c := range commands {
			src, err := filepath.Abs(filepath.Join(fresh, c))
			if err != nil {
				return err
			}
			if _, err := os.Stat(src); err != nil {
				return fmt.Errorf("%s is set, but %w", FreshBinDirEnv, err)
			}
			// A hard link (a copy across file systems), not a symlink: a
			// process's /proc/<pid>/exe then names the test's directory, as
			// a binary built there would.
			if err := linkOrCopy(src, filepath.Join(dir, c)); err != nil {
				return err
			}
		}
		return nil
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	args := []string{"build", "-o", dir + "/"}
	for _, c := range commands {
		args = append(args, "./cmd/"+c)
	}
	build := exec.Command("go", args...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building %v: %w\n%s", commands, err, out)
	}
	return nil
}

func linkOrCopy(src, dst string) error {
	if os.Link(src, dst) == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// moduleRoot is the directory of the go.mod above the working directory (a
// test runs in its package's directory).
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no go.mod above %s", wd)
		}
	}
}
