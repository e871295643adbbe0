package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// TestBinaryBuilding: a pinned binary is being built while its marker says
// so and the build's process runs, and not once the marker is gone, says
// the build failed, or names a process that is gone.
func TestBinaryBuilding(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(binaries.DirEnv, dir)
	marker := filepath.Join(dir, ".kube-"+binaries.PreviousKubeVersion+".building")
	for _, c := range []struct {
		marker string // "" for none
		want   bool
	}{
		{"", false},
		{fmt.Sprintf("building %d\n", os.Getpid()), true},
		{"failed: see bin/.kube-v1.35.4.log\n", false},
		{"building 999999999\n", false}, // an interrupted run's
	} {
		os.Remove(marker)
		if c.marker != "" {
			if err := os.WriteFile(marker, []byte(c.marker), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got := BinaryBuilding("kube-previous"); got != c.want {
			t.Errorf("marker %q: BinaryBuilding(kube-previous) = %v, want %v", c.marker, got, c.want)
		}
		if BinaryBuilding("kube") {
			t.Errorf("marker %q: kube (another version) reads as building", c.marker)
		}
	}
}
