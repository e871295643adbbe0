// Command image builds qcp-manager's OCI image without a container engine:
//
//	image -binary BIN -out DIR -version VERSION
//
// BIN is a static qcp-manager (CGO_ENABLED=0); DIR becomes an OCI image
// layout holding one image, tagged qcp-manager:VERSION. The machine cannot
// pull base images, so the base is empty: the image holds the binary, and an
// /etc/passwd and /etc/group that name the non-root user it runs as.
// go-containerregistry writes the format.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image runs as this user and group, distroless's "nonroot": the
// controllers it is for need no privilege (the process provider, which
// starts host processes, is not meant to run in a Pod).
const (
	nonRootID   = 65532
	nonRootName = "nonroot"
	entrypoint  = "/qcp-manager"
)

func main() {
	binary := flag.String("binary", "", "static qcp-manager binary to put in the image (required)")
	out := flag.String("out", "", "directory to write the OCI image layout to (required; replaced)")
	version := flag.String("version", "", "the image's version and tag (required)")
	flag.Parse()
	if *binary == "" || *out == "" || *version == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := build(*binary, *out, *version); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote qcp-manager:%s to %s\n", *version, *out)
}

// build writes the image layout of binary at version to out.
func build(binary, out, version string) error {
	data, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		rootfs, err := rootFS(data)
		return io.NopCloser(bytes.NewReader(rootfs)), err
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("making the layer: %w", err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	// A fixed date keeps the image reproducible: the same binary gives the
	// same digest.
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config.Entrypoint = []string{entrypoint}
	cfg.Config.User = fmt.Sprintf("%d:%d", nonRootID, nonRootID)
	cfg.Config.WorkingDir = "/"
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   "qcp-manager",
		"org.opencontainers.image.version": version,
		"org.opencontainers.image.source":  "https://github.com/qcp-dev/qcp",
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	path, err := layout.Write(out, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the image layout: %w", err)
	}
	return path.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": "qcp-manager:" + version,
	}))
}

// rootFS is the image's one layer: the binary, and the user it runs as.
func rootFS(binary []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0).UTC()
	files := []struct {
		name string
		mode int64
		data []byte
	}{
		{"etc/passwd", 0o644, fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:/home/%s:/sbin/nologin\n", nonRootName, nonRootID, nonRootID, nonRootName, nonRootName)},
		{"etc/group", 0o644, fmt.Appendf(nil, "root:x:0:\n%s:x:%d:\n", nonRootName, nonRootID)},
		{entrypoint[1:], 0o755, binary},
	}
	if err := tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}); err != nil {
		return nil, err
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: f.mode, Size: int64(len(f.data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
