package main

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// TestImage builds qcp-manager's image from a static binary, as `make
// image` does, unpacks it as a runtime would, and runs its entrypoint: it
// prints the image's version. The image runs as a non-root user that its
// /etc/passwd names, and the same binary gives the same digest.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds qcp-manager without cgo; not run with -short")
	}
	const version = "v0.0.0-imagetest"
	dir := t.TempDir()
	binary := filepath.Join(dir, "qcp-manager")
	compile := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/qcp-dev/qcp/internal/version.Version="+version, "-o", binary, "./cmd/qcp-manager")
	compile.Dir = filepath.Join("..", "..")
	compile.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := compile.CombinedOutput(); err != nil {
		t.Fatalf("building a static qcp-manager: %v\n%s", err, out)
	}
	if f, err := elf.Open(binary); err != nil {
		t.Fatal(err)
	} else {
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Fatal("the binary is dynamically linked: an empty base has no loader")
			}
		}
		_ = f.Close()
	}

	out := filepath.Join(dir, "image")
	if err := build(binary, out, version); err != nil {
		t.Fatal(err)
	}
	index, manifest := readLayout(t, out)
	if len(manifest.Manifests) != 1 || manifest.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "qcp-manager:"+version {
		t.Fatalf("the layout's index: %+v", manifest.Manifests)
	}
	img, err := index.Image(manifest.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.Config; len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/qcp-manager" || c.User != "65532:65532" || cfg.OS != "linux" ||
		c.Labels["org.opencontainers.image.version"] != version {
		t.Errorf("the image's config: entrypoint %v, user %q, os %q, labels %v", c.Entrypoint, c.User, cfg.OS, c.Labels)
	}

	// Unpacked as a runtime would, and the entrypoint run.
	rootfs := filepath.Join(dir, "rootfs")
	unpack(t, mutate.Extract(img), rootfs)
	passwd, err := os.ReadFile(filepath.Join(rootfs, "etc", "passwd"))
	if err != nil || !strings.Contains(string(passwd), "nonroot:x:65532:65532:") {
		t.Errorf("the image's /etc/passwd does not name its user 65532 (%v):\n%s", err, passwd)
	}
	entry := filepath.Join(rootfs, cfg.Config.Entrypoint[0])
	got, err := exec.Command(entry, "--version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(got)) != "qcp-manager "+version {
		t.Errorf("%s --version: %q, %v; want \"qcp-manager %s\"", cfg.Config.Entrypoint[0], got, err, version)
	}

	again := filepath.Join(dir, "again")
	if err := build(binary, again, version); err != nil {
		t.Fatal(err)
	}
	if _, m := readLayout(t, again); len(m.Manifests) != 1 || m.Manifests[0].Digest != manifest.Manifests[0].Digest {
		t.Errorf("the same binary gave another image: %v, then %v", manifest.Manifests, m.Manifests)
	}
}

// readLayout opens the OCI image layout in dir and reads its index.
func readLayout(t *testing.T, dir string) (v1.ImageIndex, *v1.IndexManifest) {
	t.Helper()
	index, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	return index, manifest
}

// unpack writes the files of the tar stream r under dir.
func unpack(t *testing.T, r io.ReadCloser, dir string) {
	t.Helper()
	defer r.Close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
