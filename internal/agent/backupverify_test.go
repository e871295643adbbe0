package agent

import (
	"strings"
	"testing"
)

// TestDownloadErrorKeepsTheSignatureOut: a failed download names the store's
// host, not the presigned URL, whose signature would read the snapshot from
// wherever the error is shown (the owner's status).
func TestDownloadErrorKeepsTheSignatureOut(t *testing.T) {
	const secret = "X-Amz-Signature=deadbeef"
	_, err := download(t.Context(), "http://127.0.0.1:1/bucket/snap.db?"+secret, nil)
	if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("download error %v: want the host named and the signature left out", err)
	}
}
