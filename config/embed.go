// Package config embeds the manifests QCP installs: its own CRDs (generated
// by controller-gen) and CAPI core's CRDs and webhooks (copied from the pinned
// module by `make generate`), so binaries need no source tree.
package config

import "embed"

// Manifests holds crd/bases (QCP), capi/crd (CAPI core CRDs) and
// capi/webhook-manifests.yaml.
//
//go:embed crd/bases/*.yaml capi/crd/*.yaml capi/webhook-manifests.yaml
var Manifests embed.FS
