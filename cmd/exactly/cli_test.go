package main

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

// -h and -help print a command's usage and exit 0 (the flag package's
// "flag: help requested" is no failure), for every command.
func TestEveryCommandHelpExitsZero(t *testing.T) {
	cases := [][]string{{"-h"}, {"-help"}, {"help"}, {"outbox", "parked", "-h"}, {"outbox", "drop", "-help"}}
	for name := range commands() {
		cases = append(cases, []string{name, "-h"}, []string{name, "-help"})
	}
	for _, args := range cases {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Errorf("exactly %s exited %d; stderr:\n%s", strings.Join(args, " "), code, errb.String())
		}
		if out.Len()+errb.Len() == 0 {
			t.Errorf("exactly %s printed no usage", strings.Join(args, " "))
		}
		if strings.Contains(errb.String(), "help requested") {
			t.Errorf("exactly %s reported %q", strings.Join(args, " "), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"status", "-no-such-flag"}, &out, &errb); code == 0 {
		t.Error("an unknown flag exited 0")
	}
}

func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "exactly ") {
		t.Errorf("exactly version: exit %d, %q, stderr %q", code, out.String(), errb.String())
	}
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/exactly-go/exactly", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "1e390ad0"}, {Key: "vcs.time", Value: "2026-12-01T20:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	if got, want := versionText(bi), "exactly v0.3.0 (revision 1e390ad0+dirty, 2026-12-01T20:00:00Z) go1.26.8"; got != want {
		t.Errorf("versionText = %q, want %q", got, want)
	}
	if got := versionText(&debug.BuildInfo{GoVersion: "go1.26.8"}); got != "exactly unknown (revision unknown) go1.26.8" {
		t.Errorf("versionText without VCS information = %q", got)
	}
}
