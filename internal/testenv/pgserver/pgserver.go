package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testenv/localserver"
)

// ErrNotInstalled is returned (wrapped) by Start when the PostgreSQL server
// binaries are missing and could not be installed. Test helpers may use it
// to skip rather than fail.
var ErrNotInstalled = errors.New("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")

// EnvBinDir names the environment variable that points Start at a directory
// holding initdb, pg_ctl and postgres (for example PostgreSQL 17 installed by
// install-postgres17.sh), taking precedence over PATH and
// /usr/lib/postgresql. Options.BinDir takes precedence over it.
const EnvBinDir = "EXACTLY_PG_BIN"

// serverUser is the OS user the cluster runs as when the process is root.
const serverUser = "postgres"

// stopTimeout bounds one pg_ctl stop attempt.
const stopTimeout = 30 * time.Second

// Options configures Start. The zero value is a usable configuration.
type Options struct {
	// Dir holds the cluster: the data directory "data" and the server log
	// "postgres.log". When empty, Start creates a temporary directory and
	// Stop removes it. A Dir that already holds an initialised cluster is
	// reused as is (its data survive); a Dir given here is never removed.
	Dir string
	// Logger receives progress messages; nil discards them.
	Logger *slog.Logger
	// Port is the TCP port on 127.0.0.1; 0 picks a free one.
	Port int
	// BinDir is the directory holding initdb, pg_ctl and postgres. When
	// empty, the EXACTLY_PG_BIN environment variable is used, and when that
	// is empty too the binaries are looked up (and installed if missing)
	// as the package documentation says. A BinDir or EXACTLY_PG_BIN that
	// lacks any of the three fails Start (wrapping ErrNotInstalled); there
	// is no fallback to another version.
	BinDir string
	// Settings are extra postgresql.conf parameters (for example
	// "synchronous_commit": "off"). They are written after, and so
	// override, the defaults: max_connections=200, shared_buffers=128MB.
	// Durability settings (fsync, synchronous_commit) are left at
	// PostgreSQL's safe defaults unless set here.
	Settings map[string]string
	// LogicalReplication starts the server with wal_level=logical, which
	// the outbox's WAL relay needs (logical decoding messages and a
	// replication slot). Settings may still override it.
	LogicalReplication bool
}

// Server is a running private PostgreSQL cluster. Its methods are safe for
// concurrent use.
type Server struct {
	logger    *slog.Logger
	binDir    string
	dir       string
	dataDir   string
	logPath   string
	port      int
	removeDir bool
	cred      *syscall.Credential

	mu      sync.Mutex // serialises Restart and Stop
	stopped bool

	// watchdog stops the server (and removes the directory Start
	// created) when this process dies without calling Stop; see
	// startWatchdog.
	watchdog *exec.Cmd
	// watched is the write end of the watchdog's stdin: held open while
	// this process lives, closed by the kernel when it dies.
	watched *os.File
}

// Start initialises (unless Options.Dir already holds a cluster) and starts
// a PostgreSQL cluster, returning when it accepts connections.
//
// It fails when the binaries are missing and cannot be installed (the error
// wraps ErrNotInstalled and says what to install), when the postgres OS user
// is needed but cannot be created, when initdb fails, or when the server
// does not come up; a failed start's error includes the tail of the server
// log. On failure nothing is left running and a directory Start created is
// removed.
func Start(ctx context.Context, opts Options) (*Server, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := validateSettings(opts.Settings); err != nil {
		return nil, err
	}
	binDir, err := binaries(ctx, opts.BinDir, logger)
	if err != nil {
		return nil, err
	}
	cred, err := localserver.Credential(ctx, serverUser, true, logger)
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}

	s := &Server{logger: logger, binDir: binDir, cred: cred}
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "pgserver-")
		if err != nil {
			return nil, fmt.Errorf("pgserver: creating temporary cluster directory: %w", err)
		}
		s.dir, s.removeDir = dir, true
	} else {
		dir, err := filepath.Abs(opts.Dir)
		if err != nil {
			return nil, fmt.Errorf("pgserver: resolving cluster directory %q: %w", opts.Dir, err)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("pgserver: creating cluster directory %s: %w", dir, err)
		}
		s.dir = dir
	}
	s.dataDir = filepath.Join(s.dir, "data")
	s.logPath = filepath.Join(s.dir, "postgres.log")

	if err := s.startWatchdog(); err != nil {
		if s.removeDir {
			_ = os.RemoveAll(s.dir)
		}
		return nil, err
	}
	if err := s.start(ctx, opts); err != nil {
		if s.removeDir {
			_ = os.RemoveAll(s.dir)
		}
		s.stopWatchdog()
		return nil, err
	}
	return s, nil
}

// watchdogScript is run by sh as the watchdog: $1 is pg_ctl, $2 the data
// directory, $3 "1" when the cluster directory $4 is to be removed. It
// waits for a line on its stdin, a pipe whose write end only this process
// holds: "stop-watching" (Stop ran) ends it; end of file (this process
// died, however: even SIGKILL closes its descriptors) makes it stop the
// server like a crash and remove the directory Start created.
const watchdogScript = `IFS= read -r line
[ "$line" = stop-watching ] && exit 0
"$1" -D "$2" -m immediate -w -t 30 stop >/dev/null 2>&1
[ "$3" = 1 ] && rm -rf "$4"
exit 0`

// startWatchdog starts the watchdog (see watchdogScript), as the server
// user when we are root, in a session of its own so that a signal to this
// process's group (a Ctrl-C) does not end it before it cleans up. It
// needs no goroutine: its stdin is a pipe whose write end s holds. It
// fails when the pipe or the process cannot be created.
func (s *Server) startWatchdog() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("pgserver: creating the watchdog's pipe: %w", err)
	}
	remove := "0"
	if s.removeDir {
		remove = "1"
	}
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "pgserver-watchdog",
		filepath.Join(s.binDir, "pg_ctl"), s.dataDir, remove, s.dir)
	cmd.Dir = "/"
	cmd.Env = childEnv()
	cmd.Stdin = r // an *os.File: handed over as is, no copying goroutine
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: s.cred}
	err = cmd.Start()
	r.Close() // the watchdog holds the read end; ours would keep the pipe open
	if err != nil {
		w.Close()
		return fmt.Errorf("pgserver: starting the watchdog that stops the server if this process dies: %w", err)
	}
	s.watchdog, s.watched = cmd, w
	return nil
}

// stopWatchdog tells the watchdog that the server is stopped (or was
// never started) and waits for it to exit.
func (s *Server) stopWatchdog() {
	if s.watchdog == nil {
		return
	}
	// A failed write (the watchdog died) leaves nothing to tell.
	_, _ = io.WriteString(s.watched, "stop-watching\n")
	s.watched.Close()
	_ = s.watchdog.Wait()
	s.watchdog, s.watched = nil, nil
}

func (s *Server) start(ctx context.Context, opts Options) error {
	if s.cred != nil {
		if err := localserver.EnsureTraversable(s.dir, serverUser, s.logger); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		if err := localserver.ChownTree(s.dir, s.cred); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
	}
	begin := time.Now()
	if _, err := os.Stat(filepath.Join(s.dataDir, "PG_VERSION")); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pgserver: checking for an existing cluster in %s: %w", s.dataDir, err)
		}
		if out, err := s.run(ctx, "initdb", "-D", s.dataDir, "-A", "trust", "-U", "postgres",
			"--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
			return fmt.Errorf("pgserver: initdb in %s: %w\n%s", s.dataDir, err, tail(out, 20))
		}
		if err := s.includeConf(); err != nil {
			return err
		}
	}

	port := opts.Port
	for attempt := 1; ; attempt++ {
		if opts.Port == 0 {
			p, err := localserver.FreePort()
			if err != nil {
				return fmt.Errorf("pgserver: %w", err)
			}
			port = p
		}
		if err := s.writeConf(port, settingsOf(opts)); err != nil {
			return err
		}
		s.port = port
		err := s.pgStart(ctx)
		if err == nil {
			break
		}
		// A port picked by freePort can be taken before postgres binds it.
		if opts.Port == 0 && attempt < 3 && s.bindFailed() {
			s.logger.Warn("pgserver: port taken before the server bound it; retrying", "port", port)
			continue
		}
		return err
	}
	s.logger.Info("pgserver: started", "url", s.URL("postgres"), "dir", s.dir,
		"bin", s.binDir, "elapsed", time.Since(begin).Round(time.Millisecond))
	return nil
}

// URL returns the connection URL of database db on this server, as the
// postgres superuser over TCP without TLS. It does not check that db exists.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, url.PathEscape(db))
}

// Port returns the TCP port the server listens on (on 127.0.0.1).
func (s *Server) Port() int { return s.port }

// BinDir returns the directory of the PostgreSQL binaries the server runs.
func (s *Server) BinDir() string { return s.binDir }

// Dir returns the cluster directory (data directory and log file).
func (s *Server) Dir() string { return s.dir }

// LogPath returns the path of the server's log file.
func (s *Server) LogPath() string { return s.logPath }

// CreateDatabase creates database name (quoted as an identifier, so any
// name is allowed) and returns its URL. It fails when the server cannot be
// reached or the database already exists.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("pgserver: connecting to create database %q: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "create database "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("pgserver: creating database %q: %w", name, err)
	}
	return s.URL(name), nil
}

// Restart stops the server and starts it again on the same port and data.
// immediate stops it like a crash (pg_ctl -m immediate: no checkpoint, crash
// recovery on start); otherwise it shuts down cleanly (-m fast). Open
// connections are cut either way. It fails after Stop, or when either step
// fails (the error includes the log tail).
func (s *Server) Restart(ctx context.Context, immediate bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("pgserver: restart: server already stopped")
	}
	mode := "fast"
	if immediate {
		mode = "immediate"
	}
	if err := s.pgStop(ctx, mode); err != nil {
		return fmt.Errorf("pgserver: restart: %w", err)
	}
	if err := s.pgStart(ctx); err != nil {
		return fmt.Errorf("pgserver: restart: %w", err)
	}
	s.logger.Info("pgserver: restarted", "port", s.port, "mode", mode)
	return nil
}

// Stop shuts the server down (fast, then immediate if that fails) and
// removes the cluster directory if Start created it. Calling it again is a
// no-op returning nil. It fails when the server cannot be stopped or the
// directory cannot be removed.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), 2*stopTimeout+5*time.Second)
	defer cancel()
	var errs []error
	if err := s.pgStop(ctx, "fast"); err != nil {
		s.logger.Warn("pgserver: fast shutdown failed; trying immediate", "err", err)
		if err2 := s.pgStop(ctx, "immediate"); err2 != nil {
			errs = append(errs, fmt.Errorf("pgserver: stopping server: %w", err2))
		}
	}
	if s.removeDir {
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("pgserver: removing cluster directory: %w", err))
		}
	}
	s.stopWatchdog()
	s.logger.Info("pgserver: stopped", "dir", s.dir, "removed", s.removeDir)
	return errors.Join(errs...)
}

func (s *Server) pgStart(ctx context.Context) error {
	out, err := s.run(ctx, "pg_ctl", "-w", "-t", "60", "-D", s.dataDir, "-l", s.logPath, "start")
	if err != nil {
		return fmt.Errorf("pg_ctl start (port %d): %w\n%s\nserver log %s:\n%s",
			s.port, err, strings.TrimSpace(string(out)), s.logPath, s.logTail(30))
	}
	return nil
}

func (s *Server) pgStop(ctx context.Context, mode string) error {
	out, err := s.run(ctx, "pg_ctl", "-w", "-t", strconv.Itoa(int(stopTimeout/time.Second)),
		"-D", s.dataDir, "-m", mode, "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w\n%s\nserver log %s:\n%s",
			mode, err, strings.TrimSpace(string(out)), s.logPath, s.logTail(30))
	}
	return nil
}

// run executes one of the PostgreSQL binaries (as the server user when we
// are root) and returns its combined output.
func (s *Server) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, name), args...)
	cmd.Dir = s.dir
	cmd.Env = childEnv()
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	// pg_ctl's server child redirects its own output to the log file, so
	// collecting output here does not wait for the server to exit.
	return cmd.CombinedOutput()
}

// includeConf makes postgresql.conf include pgserver.conf, which writeConf
// rewrites on every Start.
func (s *Server) includeConf() error {
	path := filepath.Join(s.dataDir, "postgresql.conf")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgserver: opening postgresql.conf to include pgserver.conf: %w", err)
	}
	_, err = io.WriteString(f, "\n# written by internal/testenv/pgserver\ninclude_if_exists = 'pgserver.conf'\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgserver: including pgserver.conf in postgresql.conf: %w", err)
	}
	return nil
}

// settingsOf returns opts.Settings, with wal_level=logical first when
// opts.LogicalReplication is set.
func settingsOf(opts Options) map[string]string {
	if !opts.LogicalReplication {
		return opts.Settings
	}
	out := map[string]string{"wal_level": "logical"}
	for k, v := range opts.Settings {
		out[k] = v
	}
	return out
}

func (s *Server) writeConf(port int, settings map[string]string) error {
	var b strings.Builder
	b.WriteString("# written by internal/testenv/pgserver on every start; edits are lost\n")
	kv := func(k, v string) { fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(v, "'", "''")) }
	kv("listen_addresses", "127.0.0.1")
	kv("port", strconv.Itoa(port))
	kv("unix_socket_directories", s.dataDir)
	kv("max_connections", "200")
	kv("shared_buffers", "128MB")
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kv(k, settings[k])
	}
	path := filepath.Join(s.dataDir, "pgserver.conf")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("pgserver: writing %s: %w", path, err)
	}
	if s.cred != nil {
		if err := os.Chown(path, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("pgserver: handing %s to the %s user: %w", path, serverUser, err)
		}
	}
	return nil
}

func (s *Server) bindFailed() bool {
	t := s.logTail(30)
	return strings.Contains(t, "could not bind") || strings.Contains(t, "already in use")
}

// logTail returns the last n lines of the server log, or a note saying why
// it cannot.
func (s *Server) logTail(n int) string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no server log: %v)", err)
	}
	defer f.Close()
	const max = 8 << 10
	if st, err := f.Stat(); err == nil && st.Size() > max {
		_, _ = f.Seek(st.Size()-max, io.SeekStart)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(reading server log: %v)", err)
	}
	return tail(data, n)
}

func tail(data []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

func validateSettings(settings map[string]string) error {
	for k, v := range settings {
		if !settingName.MatchString(k) {
			return fmt.Errorf("pgserver: invalid setting name %q", k)
		}
		if strings.ContainsAny(v, "\n\r\x00") {
			return fmt.Errorf("pgserver: setting %s: value contains a line break or NUL", k)
		}
	}
	return nil
}

// childEnv is the environment of the PostgreSQL binaries: ours without PG*
// variables (which would redirect pg_ctl) and with the C locale, so that
// log messages are predictable.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "LANG=C")
}

// binaries returns the directory to run PostgreSQL from: dir, else
// $EXACTLY_PG_BIN, else whatever findOrInstall finds.
func binaries(ctx context.Context, dir string, logger *slog.Logger) (string, error) {
	source := "Options.BinDir"
	if dir == "" {
		dir, source = os.Getenv(EnvBinDir), EnvBinDir
	}
	if dir == "" {
		return findOrInstall(ctx, logger)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("pgserver: resolving %s=%q: %w", source, dir, err)
	}
	if !hasBinaries(abs) {
		return "", fmt.Errorf("pgserver: %w in %s=%s (install PostgreSQL 17 there with internal/testenv/pgserver/install-postgres17.sh)",
			ErrNotInstalled, source, abs)
	}
	return abs, nil
}

// findOrInstall returns the directory holding initdb, pg_ctl and postgres,
// installing Debian's postgresql package first when they are missing and we
// are root.
func findOrInstall(ctx context.Context, logger *slog.Logger) (string, error) {
	if dir, ok := findBinaries(); ok {
		return dir, nil
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("pgserver: %w on PATH or under /usr/lib/postgresql/*/bin; install them as root with: apt-get install postgresql (or run internal/testenv/pgserver/install-postgres.sh)", ErrNotInstalled)
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", fmt.Errorf("pgserver: %w and apt-get is unavailable to install them; install the PostgreSQL server package by hand", ErrNotInstalled)
	}
	logger.Warn("pgserver: PostgreSQL binaries not found; installing with apt-get install postgresql")
	for _, args := range [][]string{
		{"update"},
		{"install", "-y", "--no-install-recommends", "postgresql"},
	} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("pgserver: %w; apt-get %s failed: %w\n%s",
				ErrNotInstalled, strings.Join(args, " "), err, tail(out, 20))
		}
	}
	if dir, ok := findBinaries(); ok {
		return dir, nil
	}
	return "", fmt.Errorf("pgserver: %w even after apt-get install postgresql", ErrNotInstalled)
}

// findBinaries looks for a directory holding initdb, pg_ctl and postgres:
// first where initdb on PATH lives (symlinks resolved), then
// /usr/lib/postgresql/<version>/bin, highest version first.
func findBinaries() (string, bool) {
	var candidates []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(r))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	versioned, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(versioned, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
	})
	candidates = append(candidates, versioned...)
	for _, dir := range candidates {
		if hasBinaries(dir) {
			return dir, true
		}
	}
	return "", false
}

func hasBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// compareVersions compares dotted numeric versions ("9.6" < "15").
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return strings.Compare(a, b)
}
