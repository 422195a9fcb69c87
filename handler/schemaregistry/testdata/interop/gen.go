//go:build ignore

// gen.go regenerates the interop fixtures (go run gen.go, in this
// directory, with node 20, npm and Go on PATH): it installs the pinned
// npm packages (npm ci), generates the Protobuf-ES and Go code of
// proto/v1 and proto/v2 with buf (from npm) and protoc-gen-go, starts the
// in-memory registry (srtest), runs gen.mjs against it, and writes the
// registry's schemas to fixtures/manifest.json.
package main

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
)

func run(env []string, name string, args ...string) {
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = os.Stdout, os.Stderr, append(os.Environ(), env...)
	if err := cmd.Run(); err != nil {
		log.Fatalf("%s %v: %v", name, args, err)
	}
}

// Entry is one schema of the registry after gen.mjs ran.
type Entry struct {
	Subject string `json:"subject"`
	Version int    `json:"version"`
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Schema  string `json:"schema"`
}

func main() {
	run(nil, "npm", "ci", "--ignore-scripts")
	bin, err := filepath.Abs("bin")
	if err != nil {
		log.Fatal(err)
	}
	nodeBin, err := filepath.Abs("node_modules/.bin")
	if err != nil {
		log.Fatal(err)
	}
	os.Setenv("PATH", bin+string(os.PathListSeparator)+nodeBin+string(os.PathListSeparator)+os.Getenv("PATH"))
	path := []string(nil)
	run([]string{"GOBIN=" + bin}, "go", "install", "google.golang.org/protobuf/cmd/protoc-gen-go")
	for _, v := range []string{"v1", "v2"} {
		run(path, "buf", "generate", "proto/"+v, "--template", "buf.gen.yaml", "--output", "gen/"+v)
		// The Go code goes to the package its go_package names.
		files, err := filepath.Glob("gen/" + v + "/go/github.com/exactly-go/exactly/handler/schemaregistry/internal/shoppb/" + v + "/*.pb.go")
		if err != nil || len(files) == 0 {
			log.Fatalf("buf generated no Go code for %s (%v)", v, err)
		}
		for _, f := range files {
			run(nil, "cp", f, "../../internal/shoppb/"+v+"/"+filepath.Base(f))
		}
	}
	reg := srtest.New()
	defer reg.Close()
	if err := os.MkdirAll("fixtures", 0o755); err != nil {
		log.Fatal(err)
	}
	run(nil, "node", "gen.mjs", reg.URL(), "fixtures")
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	subjects, err := cl.Subjects(ctx)
	if err != nil {
		log.Fatal(err)
	}
	sort.Strings(subjects)
	var entries []Entry
	for _, s := range subjects {
		versions, err := cl.SubjectVersions(ctx, s)
		if err != nil {
			log.Fatal(err)
		}
		for _, v := range versions {
			ss, err := cl.SchemaByVersion(ctx, s, v)
			if err != nil {
				log.Fatal(err)
			}
			entries = append(entries, Entry{Subject: s, Version: v, ID: ss.ID, Type: ss.Type.String(), Schema: ss.Schema.Schema})
		}
	}
	b, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("fixtures/manifest.json", append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	os.RemoveAll("gen")
	os.RemoveAll("bin")
}
