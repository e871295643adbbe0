// Package version reports the version QCP's own binaries were built at.
package version

import "runtime/debug"

// Version is set with -ldflags "-X github.com/qcp-dev/qcp/internal/version.Version=v0.1.0"
// by release builds; development builds report the VCS revision if known.
var Version = ""

// Get returns the version string.
func Get() string {
	if Version != "" {
		return Version
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return "dev-" + s.Value
			}
		}
	}
	return "dev"
}
