package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// goBuild builds the package at pkg into dir and returns the binary's path.
func goBuild(t *testing.T, dir, name, pkg string) string {
	t.Helper()
	bin := filepath.Join(dir, name)
	out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// interruptible starts cmd so that cancelling its context interrupts it
// (SIGINT, as Ctrl-C would) instead of killing it.
func interruptible(cmd *exec.Cmd) {
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
}

// interrupted waits for cmd, interrupted by cancelling its context, and
// fails unless it exited with status 0 (Wait reports the cancellation even
// then).
func interrupted(cmd *exec.Cmd) error {
	err := cmd.Wait()
	if cmd.ProcessState != nil && cmd.ProcessState.Success() {
		return nil
	}
	return err
}

// cleanEnv is the environment without the variables that would point a
// service elsewhere than `exactly dev` (TestMain sets DATABASE_URL).
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "EXACTLY_") && !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return env
}

// The dev loop with no other set-up: `exactly dev` starts a broker and a
// PostgreSQL and prints the export lines; examples/credit runs with them;
// a credit command produced with kcat (a third-party client) becomes a
// ledger row; Ctrl-C stops everything cleanly.
func TestDevLoopRunsTheCreditExample(t *testing.T) {
	dir := t.TempDir()
	exactlyBin := goBuild(t, dir, "exactly", ".")
	creditBin := goBuild(t, dir, "credit", "../../examples/credit")

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	devCtx, stopDev := context.WithCancel(ctx)
	defer stopDev()
	dev := exec.CommandContext(devCtx, exactlyBin, "dev", "-port", "0")
	interruptible(dev)
	dev.Env = cleanEnv()
	var devErr strings.Builder
	dev.Stderr = &devErr
	devOut, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	exports := map[string]string{}
	var pgDir string
	sc := bufio.NewScanner(devOut)
	for len(exports) < 2 && sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "export "); ok {
			k, v, _ := strings.Cut(rest, "=")
			exports[k] = strings.Trim(v, "'")
		}
		if rest, ok := strings.CutPrefix(line, "dev PostgreSQL listening on "); ok {
			if _, after, ok := strings.Cut(rest, "(cluster in "); ok {
				pgDir, _, _ = strings.Cut(after, ",")
			}
		}
	}
	if exports["DATABASE_URL"] == "" || exports["EXACTLY_KAFKA_BROKERS"] == "" {
		t.Fatalf("exactly dev printed no export lines for both variables (got %v); stderr:\n%s", exports, devErr.String())
	}
	go func() {
		for sc.Scan() {
		}
	}()

	var creditLog strings.Builder
	creditCtx, stopCredit := context.WithCancel(ctx)
	defer stopCredit()
	credit := exec.CommandContext(creditCtx, creditBin)
	interruptible(credit)
	credit.Env = append(cleanEnv(), "DATABASE_URL="+exports["DATABASE_URL"], "EXACTLY_KAFKA_BROKERS="+exports["EXACTLY_KAFKA_BROKERS"])
	credit.Stdout, credit.Stderr = &creditLog, &creditLog
	if err := credit.Start(); err != nil {
		t.Fatal(err)
	}

	cmd := `{"order_id":"order-1","account":7,"amount":100}`
	produceCommand(t, ctx, exports["EXACTLY_KAFKA_BROKERS"], "order-1", cmd)

	conn, err := pgx.Connect(ctx, exports["DATABASE_URL"])
	if err != nil {
		t.Fatalf("connecting to the dev PostgreSQL: %v", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var rows int
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for rows == 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("no ledger row for order-1 (last error %v); credit's log:\n%s\nexactly dev's log:\n%s", err, creditLog.String(), devErr.String())
		case <-tick.C:
		}
		// The table appears when credit has migrated: until then, an error.
		err = conn.QueryRow(ctx, `select count(*) from ledger where order_id = 'order-1' and account = 7 and amount = 100`).Scan(&rows)
	}
	if rows != 1 {
		t.Fatalf("%d ledger rows for order-1, want 1", rows)
	}
	conn.Close(ctx)

	stopCredit()
	if err := interrupted(credit); err != nil {
		t.Errorf("credit after Ctrl-C: %v; log:\n%s", err, creditLog.String())
	}
	stopDev()
	if err := interrupted(dev); err != nil {
		t.Errorf("exactly dev after Ctrl-C: %v; stderr:\n%s", err, devErr.String())
	}
	if !strings.Contains(devErr.String(), "dev environment stopped") {
		t.Errorf("exactly dev did not report stopping both; stderr:\n%s", devErr.String())
	}
	if pgDir == "" {
		t.Error("exactly dev did not say where the cluster is")
	} else if _, err := os.Stat(pgDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary PostgreSQL cluster %s is still there after exit (stat: %v)", pgDir, err)
	}
}

// produceCommand produces one credit command with kcat, librdkafka's
// command-line client (Debian package kafkacat). Where kcat is missing it
// uses franz-go, except under CI (CI set), which must have kcat.
func produceCommand(t *testing.T, ctx context.Context, brokers, key, value string) {
	t.Helper()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		kcat, err = exec.LookPath("kafkacat")
	}
	if err == nil {
		c := exec.CommandContext(ctx, kcat, "-P", "-b", brokers, "-t", "credit-commands", "-k", key)
		c.Stdin = strings.NewReader(value + "\n")
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("kcat -P: %v\n%s", err, out)
		}
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("kcat is missing under CI: .ci/run installs the kafkacat package")
	}
	t.Log("kcat not found (apt-get install kafkacat): producing with franz-go instead")
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "credit-commands", Key: []byte(key), Value: []byte(value)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}
