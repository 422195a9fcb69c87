// Package interop gives tests the fixtures of testdata/interop: record
// values framed by Confluent's JavaScript serializers (see gen.mjs there)
// and the registry's schemas they refer to.
package interop

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
)

// Entry is one schema of fixtures/manifest.json.
type Entry struct {
	Subject string `json:"subject"`
	Version int    `json:"version"`
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Schema  string `json:"schema"`
}

// dir is testdata/interop/fixtures.
func dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "interop", "fixtures")
}

// Manifest returns the schemas the fixtures were written with.
func Manifest(t testing.TB) []Entry {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir(), "manifest.json"))
	if err != nil {
		t.Fatalf("reading the fixtures' manifest: %v", err)
	}
	var es []Entry
	if err := json.Unmarshal(b, &es); err != nil {
		t.Fatalf("reading the fixtures' manifest: %v", err)
	}
	return es
}

// Seed puts the manifest's schemas into reg under their subjects,
// versions and ids, as the registry gen.mjs wrote against held them.
func Seed(t testing.TB, reg *srtest.Registry) {
	t.Helper()
	types := map[string]sr.SchemaType{"AVRO": sr.TypeAvro, "PROTOBUF": sr.TypeProtobuf, "JSON": sr.TypeJSON}
	for _, e := range Manifest(t) {
		reg.SeedSchema(e.Subject, e.Version, e.ID, sr.Schema{Schema: e.Schema, Type: types[e.Type]})
	}
}

// ID returns the id of subject's version in the manifest.
func ID(t testing.TB, subject string, version int) int {
	t.Helper()
	for _, e := range Manifest(t) {
		if e.Subject == subject && e.Version == version {
			return e.ID
		}
	}
	t.Fatalf("the manifest has no version %d of %s", version, subject)
	return 0
}

// Fixture returns the bytes of fixtures/name.
func Fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir(), name))
	if err != nil {
		t.Fatalf("reading fixture %s: %v", name, err)
	}
	return b
}
