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

// The CLI's manners: help goes to stdout and exits 0 (`help`, `-h`,
// `help CMD` prints that command's usage); `--version` prints the
// version; no command, an unknown one or a bad flag prints the usage on
// stderr and exits 2; chaos and demo say what they do; an error already
// naming its command is not named twice.
func TestCLIManners(t *testing.T) {
	type want struct {
		code           int
		stdout, stderr string // substrings; "" means the stream must be empty
	}
	for _, c := range []struct {
		args []string
		want want
	}{
		{nil, want{2, "", "usage: exactly <command>"}},
		{[]string{"help"}, want{0, "usage: exactly <command>", ""}},
		{[]string{"--help"}, want{0, "usage: exactly <command>", ""}},
		{[]string{"help", "status"}, want{0, "usage: exactly status [flags]", ""}},
		{[]string{"help", "no-such"}, want{2, "", `unknown command "no-such"`}},
		{[]string{"--version"}, want{0, "exactly ", ""}},
		{[]string{"-version"}, want{0, "exactly ", ""}},
		{[]string{"no-such"}, want{2, "", `exactly: unknown command "no-such"`}},
		{[]string{"status", "-no-such-flag"}, want{2, "", "flag provided but not defined: -no-such-flag\nusage: exactly status [flags]"}},
		{[]string{"status", "-interval", "soon"}, want{2, "", `invalid value "soon" for flag -interval`}},
		{[]string{"chaos", "-h"}, want{0, "usage: exactly chaos [flags]\n\nBuilds the example services", ""}},
		{[]string{"demo", "-h"}, want{0, "usage: exactly demo [flags]\n\nRuns the experiment", ""}},
		{[]string{"status", "-http", "0.0.0.0:0"}, want{1, "", "exactly status: listen address"}},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		name := strings.Join(c.args, " ")
		if code != c.want.code {
			t.Errorf("exactly %s: exit %d, want %d; stderr %q", name, code, c.want.code, errb.String())
		}
		for _, s := range []struct {
			name, got, want string
		}{{"stdout", out.String(), c.want.stdout}, {"stderr", errb.String(), c.want.stderr}} {
			if s.want == "" && s.got != "" {
				t.Errorf("exactly %s: %s %q, want nothing there", name, s.name, s.got)
			}
			if s.want != "" && !strings.Contains(s.got, s.want) {
				t.Errorf("exactly %s: %s %q, want it to contain %q", name, s.name, s.got, s.want)
			}
		}
		if strings.Contains(errb.String(), "exactly status: status:") {
			t.Errorf("exactly %s: doubled prefix in %q", name, errb.String())
		}
	}
}
