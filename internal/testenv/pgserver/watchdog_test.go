package pgserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// envKilledChild makes the test binary, run again by
// TestServerStopsWhenItsProcessIsKilled, start a server, print its
// postmaster's pid and directory, and wait to be killed.
const envKilledChild = "EXACTLY_PGSERVER_TEST_KILLED_CHILD"

// A process that started a server and dies by SIGKILL, without calling
// Stop, does not leave the server behind: within 60 s its postmaster is
// gone and the cluster directory Start created is removed. (The server used
// to outlive killed test runs, with its data directory in the temporary
// folder.)
func TestServerStopsWhenItsProcessIsKilled(t *testing.T) {
	if os.Getenv(envKilledChild) != "" {
		runKilledChild()
		return
	}
	if _, ok := findBinaries(); !ok && os.Getenv(EnvBinDir) == "" {
		t.Skip("no PostgreSQL binaries on this machine")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerStopsWhenItsProcessIsKilled$", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), envKilledChild+"=1")
	cmd.Stderr = testWriter{t}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), "pgserver-child "); ok {
				lines <- l
				return
			}
		}
		close(lines)
	}()
	var line string
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatal("the child exited without starting a server")
		}
		line = l
	case <-time.After(2 * time.Minute):
		t.Fatal("the child did not start a server within 2 minutes")
	}
	pidText, dir, _ := strings.Cut(line, " ")
	pid, err := strconv.Atoi(pidText)
	if err != nil || dir == "" || !processAlive(pid) {
		t.Fatalf("child reported %q: want a running postmaster's pid and the cluster directory", line)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, statErr := os.Stat(dir)
		alive, dirLeft := processAlive(pid), !errors.Is(statErr, os.ErrNotExist)
		if !alive && !dirLeft {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("60 s after its process was killed: postmaster %d running %t, cluster directory %s left %t",
				pid, alive, dir, dirLeft)
		}
		time.Sleep(50 * time.Millisecond) // polling for processes that give no notice of their end
	}
}

// runKilledChild starts a server, prints "pgserver-child <postmaster pid>
// <dir>" and waits to be killed; it exits with 1 after ten minutes.
func runKilledChild() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting a server:", err)
		os.Exit(1)
	}
	b, err := os.ReadFile(filepath.Join(s.dataDir, "postmaster.pid"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "reading postmaster.pid:", err)
		os.Exit(1)
	}
	pid, _, _ := strings.Cut(string(b), "\n")
	fmt.Printf("pgserver-child %s %s\n", strings.TrimSpace(pid), s.Dir())
	time.Sleep(10 * time.Minute)
	os.Exit(1)
}

// processAlive reports whether process pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false
		}
		return syscall.Kill(pid, 0) == nil
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}
