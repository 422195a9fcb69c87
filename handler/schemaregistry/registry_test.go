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
