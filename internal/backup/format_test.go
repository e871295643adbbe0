package backup

import (
	"strings"
	"testing"
	"time"
)

// TestExpiredKeepsTheNewestAndTheNewestVerified: retention drops what is
// beyond the count or the age, but never the newest verified backup.
func TestExpiredKeepsTheNewestAndTheNewestVerified(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	at := func(minutesAgo int, verified bool) Manifest {
		m := Manifest{Snapshot: time.Duration(minutesAgo).String(), Started: now.Add(-time.Duration(minutesAgo) * time.Minute)}
		if verified {
			m.Verified = &Verification{Time: m.Started}
		}
		return m
	}
	names := func(ms []Manifest) string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Snapshot)
		}
		return strings.Join(out, ",")
	}
	all := []Manifest{at(1, true), at(30, true), at(10, true), at(20, true)}
	for _, tc := range []struct {
		name   string
		ms     []Manifest
		keep   int
		maxAge time.Duration
		want   string
	}{
		{"count", all, 2, 0, "20ns,30ns"},
		{"age", all, 0, 15 * time.Minute, "20ns,30ns"},
		{"both, the count wins", all, 1, time.Hour, "10ns,20ns,30ns"},
		{"no limit", all, 0, 0, ""},
		{"the newest verified stays beyond the count", []Manifest{at(1, false), at(2, false), at(3, true), at(4, true)}, 2, 0, "4ns"},
		{"the newest verified stays beyond the age", []Manifest{at(100, true), at(200, true)}, 0, time.Minute, "200ns"},
	} {
		if got := names(Expired(tc.ms, tc.keep, tc.maxAge, now)); got != tc.want {
			t.Errorf("%s: expired %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestManifestRoundTripAndRefusals: a manifest reads back as written, and
// one of another format, with a field missing or with an unknown field is
// refused.
func TestManifestRoundTripAndRefusals(t *testing.T) {
	c := ClusterRef{Namespace: "ns", Kind: "EtcdCluster", Name: "e1"}
	started := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	m := Manifest{Format: FormatVersion, Snapshot: Name(c, started, true), Cluster: c, EtcdVersion: "3.6.16", Revision: 42,
		Members: []string{"a", "b"}, TakenFrom: "a", Leader: "b", Size: 10, SHA256: strings.Repeat("0", 64), Encrypted: true,
		Recipient: "age1x", Started: started, Finished: started.Add(time.Second)}
	if m.Snapshot != "ns/etcdcluster/e1/20261129T120000.000Z.db.age" || ManifestName(m.Snapshot) != m.Snapshot+".json" {
		t.Fatalf("names: %s", m.Snapshot)
	}
	got, err := DecodeManifest(m.Encode())
	if err != nil || got.Snapshot != m.Snapshot || got.Revision != 42 || !got.Started.Equal(started) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for name, b := range map[string]string{
		"format":  strings.Replace(string(m.Encode()), `"format": 1`, `"format": 2`, 1),
		"sha":     strings.Replace(string(m.Encode()), strings.Repeat("0", 64), "00", 1),
		"unknown": strings.Replace(string(m.Encode()), `"format": 1`, `"format": 1, "extra": true`, 1),
		"garbage": "not json",
	} {
		if _, err := DecodeManifest([]byte(b)); err == nil {
			t.Errorf("%s: a bad manifest was taken", name)
		}
	}
	if _, err := ParseKey([]byte("# created: now\nAGE-SECRET-KEY-1NOTAKEY\n")); err == nil || !strings.Contains(err.Error(), "age-keygen") {
		t.Errorf("a bad key: %v", err)
	}
	k, _ := NewKey()
	if e, err := ParseKey(append([]byte("# a comment\n"), k...)); err != nil || !strings.HasPrefix(e.Recipient(), "age1") {
		t.Errorf("a good key: %v", err)
	}
}

// TestSchedule: an interval counts from the last snapshot, a cron
// expression gives the next time it names after it, a first snapshot is
// due at once, and a bad expression is refused with an example.
func TestSchedule(t *testing.T) {
	last := time.Date(2026, 11, 29, 10, 17, 0, 0, time.UTC)
	iv := int32(600)
	s, err := ParseSchedule(&iv, "")
	if err != nil || !s.Next(last).Equal(last.Add(10*time.Minute)) || !s.Next(time.Time{}).IsZero() {
		t.Fatalf("interval: %v, next %v", err, s.Next(last))
	}
	s, err = ParseSchedule(nil, "0 */6 * * *")
	if err != nil || !s.Next(last).Equal(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)) {
		t.Fatalf("cron: %v, next %v", err, s.Next(last))
	}
	if s, err = ParseSchedule(nil, "@hourly"); err != nil || !s.Next(last).Equal(time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC)) {
		t.Fatalf("@hourly: %v", err)
	}
	for _, bad := range []struct {
		iv   *int32
		expr string
		want string
	}{{nil, "", "give intervalSeconds or cron"}, {&iv, "@hourly", "not both"}, {nil, "every hour", "five fields"}, {nil, "61 * * * *", "five fields"}} {
		if _, err := ParseSchedule(bad.iv, bad.expr); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseSchedule(%v, %q): %v, want %q", bad.iv, bad.expr, err, bad.want)
		}
	}
}
