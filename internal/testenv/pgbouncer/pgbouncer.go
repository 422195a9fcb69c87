package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testenv/localserver"
)

// ErrNotInstalled is returned (wrapped) by Start when the pgbouncer binary
// is missing.
var ErrNotInstalled = errors.New("pgbouncer binary not found (install Debian's pgbouncer package: apt-get install pgbouncer)")

// runUser is the OS user pgbouncer runs as when the process is root.
const runUser = "postgres"

// readyTimeout bounds how long Start waits for the pooler to accept
// connections.
const readyTimeout = 20 * time.Second

// Pool modes PgBouncer offers (Options.PoolMode).
const (
	// Transaction lends a server connection to a client for one
	// transaction: nothing of a session (prepared statements, session
	// settings, session advisory locks, LISTEN) survives it.
	Transaction = "transaction"
	// Session lends a server connection for the client's whole session,
	// like a direct connection; it saves no server connections.
	Session = "session"
	// Statement lends a server connection for one statement; multi-
	// statement transactions are refused.
	Statement = "statement"
)

// Options configures Start. Upstream is required; the rest have defaults.
type Options struct {
	// Upstream is a URL of the PostgreSQL server to pool (for example
	// pgserver.Server.URL("postgres")); only its host and port are used.
	Upstream string
	// PoolMode is Transaction (the default), Session or Statement.
	PoolMode string
	// DefaultPoolSize is the number of server connections per database
	// and user (default_pool_size); 0 means 20.
	DefaultPoolSize int
	// MaxClientConn is the number of client connections accepted
	// (max_client_conn); 0 means 1000.
	MaxClientConn int
	// Settings are extra [pgbouncer] parameters, written after (and so
	// overriding) the ones Start writes.
	Settings map[string]string
	// Binary is the pgbouncer executable; empty means "pgbouncer" on PATH,
	// then /usr/sbin/pgbouncer.
	Binary string
	// Logger receives progress messages; nil discards them.
	Logger *slog.Logger
}

// Bouncer is a running PgBouncer. Its methods are safe for concurrent use.
type Bouncer struct {
	logger  *slog.Logger
	dir     string
	logPath string
	port    int
	mode    string

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	werr error         // the process's exit status, set before done closes

	mu      sync.Mutex
	stopped bool
}

// Start writes a configuration into a new temporary directory and starts
// pgbouncer in front of opts.Upstream on a free port of 127.0.0.1,
// returning when it accepts connections. It fails when the binary is
// missing (wrapping ErrNotInstalled), when opts is invalid, when the run
// user cannot be found, or when the pooler does not come up (the error
// includes the tail of its log). On failure nothing is left running and the
// directory is removed.
func Start(ctx context.Context, opts Options) (*Bouncer, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	host, upPort, err := upstream(opts.Upstream)
	if err != nil {
		return nil, err
	}
	mode := opts.PoolMode
	if mode == "" {
		mode = Transaction
	}
	if mode != Transaction && mode != Session && mode != Statement {
		return nil, fmt.Errorf("pgbouncer: pool mode %q: want %q, %q or %q", mode, Transaction, Session, Statement)
	}
	if err := validateSettings(opts.Settings); err != nil {
		return nil, err
	}
	bin, err := binary(opts.Binary)
	if err != nil {
		return nil, err
	}
	cred, err := localserver.Credential(ctx, runUser, false, nil)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w (internal/testenv/pgserver creates that user)", err)
	}
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: creating its directory: %w", err)
	}
	b := &Bouncer{logger: logger, dir: dir, logPath: filepath.Join(dir, "pgbouncer.log"), mode: mode}
	for attempt := 1; ; attempt++ {
		port, err := localserver.FreePort()
		if err == nil {
			err = b.start(ctx, bin, cred, host, upPort, port, opts)
		}
		if err == nil {
			break
		}
		// A port picked by freePort can be taken before pgbouncer binds it.
		if attempt < 3 && strings.Contains(b.logTail(20), "in use") {
			logger.Warn("pgbouncer: port taken before the pooler bound it; retrying", "port", port)
			continue
		}
		_ = os.RemoveAll(dir)
		return nil, err
	}
	logger.Info("pgbouncer: started", "port", b.port, "pool_mode", mode, "upstream", net.JoinHostPort(host, upPort), "dir", dir)
	return b, nil
}

// New starts a Bouncer for t (see Start) and stops it when t ends. It
// fails t when the pooler cannot start.
func New(t testing.TB, opts Options) *Bouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("pgbouncer: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Errorf("pgbouncer: %v", err)
		}
	})
	return b
}

func (b *Bouncer) start(ctx context.Context, bin string, cred *syscall.Credential, host, upPort string, port int, opts Options) error {
	b.port = port
	conf := filepath.Join(b.dir, "pgbouncer.ini")
	auth := filepath.Join(b.dir, "userlist.txt")
	if err := os.WriteFile(auth, []byte(`"postgres" ""`+"\n"), 0o600); err != nil {
		return fmt.Errorf("pgbouncer: writing %s: %w", auth, err)
	}
	if err := os.WriteFile(conf, []byte(config(host, upPort, port, b.mode, auth, opts)), 0o600); err != nil {
		return fmt.Errorf("pgbouncer: writing %s: %w", conf, err)
	}
	logFile, err := os.OpenFile(b.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("pgbouncer: opening its log %s: %w", b.logPath, err)
	}
	defer logFile.Close() // the child holds its own descriptor
	if cred != nil {
		if err := localserver.ChownTree(b.dir, cred); err != nil {
			return fmt.Errorf("pgbouncer: %w", err)
		}
		if err := localserver.EnsureTraversable(b.dir, runUser, nil); err != nil {
			return fmt.Errorf("pgbouncer: %w", err)
		}
	}
	cmd := exec.Command(bin, conf)
	cmd.Dir = b.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgbouncer: starting %s: %w", bin, err)
	}
	b.cmd, b.done = cmd, make(chan struct{})
	go func() {
		b.werr = cmd.Wait()
		close(b.done)
	}()
	if err := b.awaitReady(ctx); err != nil {
		b.kill()
		return fmt.Errorf("pgbouncer: %w\nlog %s:\n%s", err, b.logPath, b.logTail(20))
	}
	return nil
}

// config renders pgbouncer.ini.
func config(host, upPort string, port int, mode, auth string, opts Options) string {
	poolSize, maxClient := opts.DefaultPoolSize, opts.MaxClientConn
	if poolSize <= 0 {
		poolSize = 20
	}
	if maxClient <= 0 {
		maxClient = 1000
	}
	var s strings.Builder
	s.WriteString("; written by internal/testenv/pgbouncer\n[databases]\n")
	fmt.Fprintf(&s, "* = host=%s port=%s\n\n[pgbouncer]\n", host, upPort)
	kv := func(k, v string) { fmt.Fprintf(&s, "%s = %s\n", k, v) }
	kv("listen_addr", "127.0.0.1")
	kv("listen_port", strconv.Itoa(port))
	kv("unix_socket_dir", "")
	kv("auth_type", "trust")
	kv("auth_file", auth)
	kv("admin_users", "postgres")
	kv("stats_users", "postgres")
	kv("pool_mode", mode)
	kv("default_pool_size", strconv.Itoa(poolSize))
	kv("max_client_conn", strconv.Itoa(maxClient))
	kv("ignore_startup_parameters", "extra_float_digits")
	kv("server_login_retry", "1")
	keys := make([]string, 0, len(opts.Settings))
	for k := range opts.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kv(k, opts.Settings[k])
	}
	return s.String()
}

// awaitReady waits until the admin console answers, the process exits, or
// readyTimeout passes.
func (b *Bouncer) awaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, b.adminURL())
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		select {
		case <-b.done:
			return fmt.Errorf("exited before accepting connections: %v", b.werr)
		case <-ctx.Done():
			return fmt.Errorf("not accepting connections on port %d: %w (last: %v)", b.port, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// URL returns the URL of database db of the upstream server through the
// pooler, as the postgres user without TLS. It does not check that db
// exists.
func (b *Bouncer) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", b.port, url.PathEscape(db))
}

// Through returns dbURL (a URL of the upstream server, for example from
// testenv.DBURL) with its host and port replaced by the pooler's, keeping
// the database, user and query parameters. It panics when dbURL does not
// parse, which is a programming error in the test.
func (b *Bouncer) Through(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		panic(fmt.Sprintf("pgbouncer: Through(%q): %v", dbURL, err))
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
	return u.String()
}

// Port returns the TCP port the pooler listens on (on 127.0.0.1).
func (b *Bouncer) Port() int { return b.port }

// PoolMode returns the pool mode the pooler runs in.
func (b *Bouncer) PoolMode() string { return b.mode }

// LogPath returns the path of the pooler's log.
func (b *Bouncer) LogPath() string { return b.logPath }

func (b *Bouncer) adminURL() string {
	return b.URL("pgbouncer") + "&default_query_exec_mode=simple_protocol"
}

// Pool is one row of the admin console's SHOW POOLS: the clients and server
// connections of one database and user.
type Pool struct {
	Database, User string
	// ClientActive and ClientWaiting count client connections linked to a
	// server connection, and waiting for one.
	ClientActive, ClientWaiting int
	// ServerActive counts server connections linked to a client;
	// ServerIdle, ServerUsed, ServerTested and ServerLogin the others.
	ServerActive, ServerIdle, ServerUsed, ServerTested, ServerLogin int
	// Mode is the pool mode.
	Mode string
}

// Servers returns the server connections the pool holds open, in any state.
func (p Pool) Servers() int {
	return p.ServerActive + p.ServerIdle + p.ServerUsed + p.ServerTested + p.ServerLogin
}

// Pools returns SHOW POOLS from the admin console. It fails when the
// console cannot be reached or its answer has an unexpected shape.
func (b *Bouncer) Pools(ctx context.Context) ([]Pool, error) {
	conn, err := pgx.Connect(ctx, b.adminURL())
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: connecting to the admin console: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "SHOW POOLS")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: SHOW POOLS: %w", err)
	}
	defer rows.Close()
	var out []Pool
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, fmt.Errorf("pgbouncer: reading SHOW POOLS: %w", err)
		}
		var p Pool
		for i, fd := range rows.FieldDescriptions() {
			str := fmt.Sprint(vals[i])
			n, _ := strconv.Atoi(str)
			switch fd.Name {
			case "database":
				p.Database = str
			case "user":
				p.User = str
			case "cl_active":
				p.ClientActive = n
			case "cl_waiting":
				p.ClientWaiting = n
			case "sv_active":
				p.ServerActive = n
			case "sv_idle":
				p.ServerIdle = n
			case "sv_used":
				p.ServerUsed = n
			case "sv_tested":
				p.ServerTested = n
			case "sv_login":
				p.ServerLogin = n
			case "pool_mode":
				p.Mode = str
			}
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgbouncer: reading SHOW POOLS: %w", err)
	}
	return out, nil
}

// Stop shuts the pooler down (SIGTERM: immediate shutdown, every client
// cut; SIGKILL after 10 s) and removes its directory. Calling it again is a
// no-op returning nil. It fails when the directory cannot be removed.
func (b *Bouncer) Stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return nil
	}
	b.stopped = true
	b.kill()
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("pgbouncer: removing %s: %w", b.dir, err)
	}
	b.logger.Info("pgbouncer: stopped", "port", b.port)
	return nil
}

// kill stops the process (SIGTERM, then SIGKILL) and waits for it.
func (b *Bouncer) kill() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
	b.cmd = nil
}

// logTail returns the last n lines of the log, or a note saying why it
// cannot.
func (b *Bouncer) logTail(n int) string {
	data, err := os.ReadFile(b.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// upstream returns the host and port of the upstream URL.
func upstream(raw string) (host, port string, err error) {
	if raw == "" {
		return "", "", errors.New("pgbouncer: Options.Upstream is empty: give the URL of the PostgreSQL server to pool")
	}
	cfg, err := pgx.ParseConfig(raw)
	if err != nil {
		return "", "", fmt.Errorf("pgbouncer: parsing Options.Upstream: %w", err)
	}
	return cfg.Host, strconv.Itoa(int(cfg.Port)), nil
}

var settingName = regexp.MustCompile(`^[a-z_]+$`)

func validateSettings(settings map[string]string) error {
	for k, v := range settings {
		if !settingName.MatchString(k) {
			return fmt.Errorf("pgbouncer: invalid setting name %q", k)
		}
		if strings.ContainsAny(v, "\n\r\x00") {
			return fmt.Errorf("pgbouncer: setting %s: value contains a line break or NUL", k)
		}
	}
	return nil
}

// binary returns the pgbouncer executable to run.
func binary(explicit string) (string, error) {
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", fmt.Errorf("pgbouncer: %w: Options.Binary %s: %v", ErrNotInstalled, explicit, err)
		}
		return explicit, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("pgbouncer: %w", ErrNotInstalled)
}
