package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

// runVersion prints the module version, the VCS revision (with its time
// and "+dirty" when the tree had changes) and the Go version the binary was
// built with, from runtime/debug.ReadBuildInfo. It fails on arguments or
// flags other than -h.
func runVersion(_ context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly version\n\nPrints the module version, the VCS revision and the Go version of this binary.")
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return fmt.Errorf("parsing flags: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	bi, _ := debug.ReadBuildInfo()
	_, err := fmt.Fprintln(stdout, versionText(bi))
	return err
}

// versionText renders bi as one line: "exactly <module version> (revision
// <rev>[+dirty], <time>) <go version>"; what bi lacks is "unknown" (a test
// binary or a build outside a VCS checkout has no revision).
func versionText(bi *debug.BuildInfo) string {
	if bi == nil {
		return "exactly unknown (no build information)"
	}
	version := bi.Main.Version
	if version == "" {
		version = "unknown"
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	rev := settings["vcs.revision"]
	if rev == "" {
		rev = "unknown"
	}
	if settings["vcs.modified"] == "true" {
		rev += "+dirty"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "exactly %s (revision %s", version, rev)
	if t := settings["vcs.time"]; t != "" {
		fmt.Fprintf(&b, ", %s", t)
	}
	fmt.Fprintf(&b, ") %s", bi.GoVersion)
	return b.String()
}
