package localenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/qcp-dev/qcp/images"
)

// TestUpdateMachineImage: a binary built after the manager installed the
// machine image is in the image once it is updated, beside what was there.
func TestUpdateMachineImage(t *testing.T) {
	bin := t.TempDir()
	write := func(name string) {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("qcp-agent")
	write("kube-v1.36.3")
	e := &Env{Dir: t.TempDir()}
	if err := e.UpdateMachineImage(); err != nil {
		t.Fatalf("without an image: %v, want nothing done", err)
	}
	image, err := e.installMachineImage(bin, filepath.Join(bin, "qcp-manager"))
	if err != nil {
		t.Fatal(err)
	}
	_, binDir := images.Paths(image)
	write("kube-v1.35.4") // built beside the tests
	if _, err := os.Stat(filepath.Join(binDir, "kube-v1.35.4")); err == nil {
		t.Fatal("the image has a binary built after it")
	}
	if err := e.UpdateMachineImage(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kube-v1.35.4", "kube-v1.36.3"} {
		if _, err := os.Stat(filepath.Join(binDir, name)); err != nil {
			t.Errorf("after the update, the image: %v", err)
		}
	}
}
