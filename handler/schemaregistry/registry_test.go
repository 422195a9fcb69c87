package schemaregistry_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry"
)

// TestRegisterBehindAWrongURLIsAnOutage checks that a 404 without the
// registry's error code (a wrong URL, a proxy's page) makes registering a
// schema an outage, not a schema the registry refused: the records that
// emit it wait for the configuration to be fixed, and none is dead-lettered.
func TestRegisterBehindAWrongURLIsAnOutage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "<html>404 page not found</html>", http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	cl, err := sr.NewClient(sr.URLs(srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	reg := schemaregistry.New(cl)
	_, err = reg.Register(context.Background(), "orders-value", sr.Schema{Schema: `{"type":"string"}`, Type: sr.TypeAvro})
	var ue *handler.UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("Register behind a plain 404 = %v, want a *handler.UnavailableError", err)
	}
	var se *schemaregistry.SchemaError
	if errors.As(err, &se) {
		t.Fatalf("Register behind a plain 404 = %v, also a *SchemaError: its records would be dead-lettered", err)
	}
}

// TestSchemaIDPastTheRegistrysRangeIsASchemaError checks that a header
// naming an id no registry can hold (ids are signed 32-bit) is the record's
// fault, dead-lettered, rather than a lookup the registry answers with a
// bare 404 that would read as an outage for ever.
func TestSchemaIDPastTheRegistrysRangeIsASchemaError(t *testing.T) {
	_, err := schemaregistry.Split([]byte{0, 0x80, 0, 0, 1, 'x'})
	var se *schemaregistry.SchemaError
	if !errors.As(err, &se) || !errors.Is(err, schemaregistry.ErrUnknownSchema) {
		t.Fatalf("Split of schema id 2147483649 = %v, want a *SchemaError wrapping ErrUnknownSchema", err)
	}
	if f, err := schemaregistry.Split([]byte{0, 0x7f, 0xff, 0xff, 0xff, 'x'}); err != nil || f.ID != 2147483647 {
		t.Fatalf("Split of schema id 2147483647 = %+v, %v; want the id", f, err)
	}
}
