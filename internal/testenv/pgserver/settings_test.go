package pgserver

import "testing"

// TestLogicalReplicationSetting checks that LogicalReplication writes
// wal_level=logical, that Settings still override it, and that Settings
// pass through unchanged without it.
func TestLogicalReplicationSetting(t *testing.T) {
	got := settingsOf(Options{LogicalReplication: true, Settings: map[string]string{"fsync": "on"}})
	if got["wal_level"] != "logical" || got["fsync"] != "on" {
		t.Fatalf("settings %v, want wal_level=logical and fsync=on", got)
	}
	got = settingsOf(Options{LogicalReplication: true, Settings: map[string]string{"wal_level": "replica"}})
	if got["wal_level"] != "replica" {
		t.Fatalf("settings %v: Settings must override LogicalReplication", got)
	}
	if got := settingsOf(Options{Settings: map[string]string{"a": "b"}}); len(got) != 1 || got["a"] != "b" {
		t.Fatalf("settings %v without LogicalReplication, want Settings unchanged", got)
	}
}
