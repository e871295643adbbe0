// Package atomicfile replaces files so that a reader never sees one
// half-written.
package atomicfile

import (
	"fmt"
	"os"
)

// Write writes data to path through a temporary file and a rename.
func Write(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
