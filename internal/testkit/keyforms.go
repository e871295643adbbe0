package testkit

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
)

// leakKey is one private key QCP created: where it was first seen, and the
// bytes that make it secret.
type leakKey struct {
	origin string
	secret []byte
}

// windowLen is how many characters of a needle index it; every needle is
// at least this long.
const windowLen = 32

// needle is one encoding of a key's secret.
type needle struct {
	text string
	key  *leakKey
	form string
}

// leakFinder finds keys' secrets in text, in every form QCP's keys travel
// in. Base64 at any byte alignment is covered: whatever encodes a key, its
// 3-byte groups start at one of three offsets within the secret.
type leakFinder struct {
	base64, hex map[string][]needle // by the needle's first windowLen characters
}

var base64Forms = []string{
	"base64 (PEM or DER)",
	"base64 of base64 (a kubeconfig's client-key-data, a Secret's data)",
	"base64 of base64 of base64 (a kubeconfig in a Secret's data)",
}

func newLeakFinder(keys map[string]*leakKey) *leakFinder {
	f := &leakFinder{base64: map[string][]needle{}, hex: map[string][]needle{}}
	for _, k := range keys {
		addNeedle(f.hex, needle{hex.EncodeToString(k.secret), k, "DER-hex"})
		level := [][]byte{k.secret}
		for _, form := range base64Forms {
			var next [][]byte
			for _, src := range level {
				for offset := range 3 {
					n := (len(src) - offset) / 3 * 3
					enc := base64.StdEncoding.EncodeToString(src[offset : offset+n])
					addNeedle(f.base64, needle{enc, k, form})
					next = append(next, []byte(enc))
				}
			}
			level = next
		}
	}
	return f
}

func addNeedle(m map[string][]needle, n needle) {
	m[n.text[:windowLen]] = append(m[n.text[:windowLen]], n)
}

type hit struct {
	key  *leakKey
	form string
}

// find returns each key and form found in data, once.
func (f *leakFinder) find(data []byte) []hit {
	var hits []hit
	seen := map[hit]bool{}
	record := func(n needle) {
		h := hit{n.key, n.form}
		if !seen[h] {
			seen[h] = true
			hits = append(hits, h)
		}
	}
	// Every encoding is a run of base64 characters (hex is a subset), so
	// only runs long enough to hold a needle are looked at.
	for start := 0; start < len(data); {
		end := start
		for end < len(data) && isBase64(data[end]) {
			end++
		}
		if run := data[start:end]; len(run) >= windowLen {
			lower := bytes.ToLower(run)
			for i := 0; i+windowLen <= len(run); i++ {
				for _, n := range f.base64[string(run[i:i+windowLen])] {
					if bytes.HasPrefix(run[i:], []byte(n.text)) {
						record(n)
					}
				}
				for _, n := range f.hex[string(lower[i:i+windowLen])] {
					if bytes.HasPrefix(lower[i:], []byte(n.text)) {
						record(n)
					}
				}
			}
		}
		start = end + 1
	}
	return hits
}

func isBase64(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/'
}
