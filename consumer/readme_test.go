package consumer_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/consumer"
)

// envVars lists the variables of the env tags of t, nested structs included.
func envVars(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name != "" {
			out = append(out, name)
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			out = append(out, envVars(f.Type)...)
		}
	}
	return out
}

// The README's configuration table lists every variable the consumer reads.
func TestReadmeDocumentsEveryVariable(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	vars := envVars(reflect.TypeOf(consumer.Config{}))
	if len(vars) < 10 {
		t.Fatalf("found only %d variables in consumer.Config", len(vars))
	}
	for _, v := range vars {
		if !strings.Contains(string(readme), "| `"+v+"` |") {
			t.Errorf("README.md has no configuration row for %s", v)
		}
	}
}
