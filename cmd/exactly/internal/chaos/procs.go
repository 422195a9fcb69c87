package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// buildBinaries compiles the services into dir, unless they are there
// already, and returns their paths by name: "credit" is the chaos credit
// service (examples/credit plus the user-code faults), "notify" is
// examples/notify.
func buildBinaries(ctx context.Context, dir string) (map[string]string, error) {
	bins := map[string]string{}
	for name, pkg := range map[string]string{
		"credit": "github.com/exactly-go/exactly/cmd/exactly/internal/chaos/creditsvc",
		"notify": "github.com/exactly-go/exactly/examples/notify",
	} {
		out := filepath.Join(dir, "chaos-"+name)
		bins[name] = out
		if _, err := os.Stat(out); err == nil {
			continue
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
		cmd.Env = os.Environ()
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s: %w\n%s", pkg, err, b)
		}
	}
	return bins, nil
}

// proc is one service process (a group member), restartable. Its output
// goes to a log file that survives restarts.
type proc struct {
	name string
	bin  string
	env  []string
	logf *os.File
	log  *slog.Logger
	// onExit is told of exits that no fault caused.
	onExit func(p *proc, err error)

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{} // closed when cmd has exited
	expected bool          // the exit of cmd was caused by the harness
	paused   bool
	starts   int
}

func newProc(name, bin string, env []string, logDir string, log *slog.Logger, onExit func(*proc, error)) (*proc, error) {
	f, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log of %s: %w", name, err)
	}
	return &proc{name: name, bin: bin, env: env, logf: f, log: log, onExit: onExit}, nil
}

// start starts the process if it is not running.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return nil
	}
	cmd := exec.Command(p.bin)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = p.logf, p.logf
	// Own process group (a terminal's ^C reaches the harness only, which
	// stops the services itself); killed with the harness.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.starts++
	fmt.Fprintf(p.logf, "--- chaos: start #%d at %s\n", p.starts, time.Now().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.expected, p.paused = cmd, done, false, false
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		expected := p.expected
		if p.cmd == cmd {
			p.cmd = nil
		}
		p.mu.Unlock()
		fmt.Fprintf(p.logf, "--- chaos: exit (%v) at %s\n", err, time.Now().Format(time.RFC3339Nano))
		close(done)
		if !expected && p.onExit != nil {
			p.onExit(p, err)
		}
	}()
	return nil
}

// running reports whether the process runs (paused or not).
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// isPaused reports whether the process is stopped by SIGSTOP.
func (p *proc) isPaused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && p.paused
}

// signal sends sig to the running process and, for a signal that ends it,
// waits for its exit (bounded by ctx). It reports whether a process was
// signalled.
func (p *proc) signal(ctx context.Context, sig syscall.Signal, ends bool) bool {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if cmd == nil {
		p.mu.Unlock()
		return false
	}
	if ends {
		p.expected = true
	}
	switch sig {
	case syscall.SIGSTOP:
		p.paused = true
	case syscall.SIGCONT:
		p.paused = false
	}
	err := cmd.Process.Signal(sig)
	p.mu.Unlock()
	if err != nil {
		return false
	}
	if ends {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	return true
}

// cont resumes the process if it is paused, reporting whether it was.
func (p *proc) cont() bool {
	if !p.isPaused() {
		return false
	}
	return p.signal(context.Background(), syscall.SIGCONT, false)
}

// kill9 kills the process like a crash and waits for it to be gone.
func (p *proc) kill9(ctx context.Context) bool { return p.signal(ctx, syscall.SIGKILL, true) }

// terminate asks the process to shut down cleanly (SIGTERM after SIGCONT)
// and kills it if it has not exited within grace.
func (p *proc) terminate(grace time.Duration) {
	p.signal(context.Background(), syscall.SIGCONT, false)
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	p.signal(ctx, syscall.SIGTERM, true)
	if p.running() {
		p.log.Warn("chaos: process did not stop on SIGTERM; killing it", "proc", p.name)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.kill9(ctx)
	}
}

func (p *proc) close() error { return p.logf.Close() }

// childEnv is the harness's environment without the variables the
// services read, plus env.
func childEnv(env map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "EXACTLY_") || k == "DATABASE_URL" || strings.HasPrefix(k, "OTEL_") {
			continue
		}
		out = append(out, kv)
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// exitDescription describes how a process ended.
func exitDescription(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.String()
	}
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
