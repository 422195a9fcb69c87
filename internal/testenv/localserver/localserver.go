package localserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// Credential returns nil when the process is not root, and otherwise the
// credential of the OS user name, for servers (PostgreSQL, PgBouncer) that
// refuse to run as root. With create set, a missing user is created as a
// system user without a home or a login shell (useradd); without it, a
// missing user is an error. It fails when the user cannot be looked up,
// created or parsed.
func Credential(ctx context.Context, name string, create bool, logger *slog.Logger) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if !errors.As(err, &unknown) || !create {
			return nil, fmt.Errorf("looking up the %s OS user to run the server as (servers refuse to run as root): %w", name, err)
		}
		if logger != nil {
			logger.Warn("running as root; creating an OS user to run the server", "user", name)
		}
		out, err := exec.CommandContext(ctx, "useradd", "--system", "--user-group", "--no-create-home",
			"--shell", "/usr/sbin/nologin", name).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("running as root, the server needs an unprivileged user; useradd %s: %w: %s",
				name, err, bytes.TrimSpace(out))
		}
		if u, err = user.Lookup(name); err != nil {
			return nil, fmt.Errorf("looking up the %s OS user after creating it: %w", name, err)
		}
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parsing uid %q of user %s: %w", u.Uid, name, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parsing gid %q of user %s: %w", u.Gid, name, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{uint32(gid)}}, nil
}

// EnsureTraversable grants others search (x) permission on every ancestor
// of dir that lacks it, so that the OS user name can reach dir; each grant
// is logged at INFO when logger is not nil. It fails when an ancestor
// cannot be read or changed.
func EnsureTraversable(dir, name string, logger *slog.Logger) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("checking that the %s user can reach %s: %w", name, dir, err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			if logger != nil {
				logger.Info("granting others search permission so the server's user can reach its directory", "path", p, "user", name)
			}
			if err := os.Chmod(p, st.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("granting search permission on %s for the %s user: %w", p, name, err)
			}
		}
		if parent := filepath.Dir(p); parent == p {
			return nil
		}
	}
}

// ChownTree hands dir and everything under it to cred's user and group. It
// fails, naming dir, at the first entry it cannot walk or change.
func ChownTree(dir string, cred *syscall.Credential) error {
	err := filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(cred.Uid), int(cred.Gid))
	})
	if err != nil {
		return fmt.Errorf("handing %s to uid %d: %w", dir, cred.Uid, err)
	}
	return nil
}

// FreePort asks the kernel for a free TCP port on 127.0.0.1. The port is
// free when it returns; another process may take it before the caller
// binds it. It fails when no listener can be opened.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("picking a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
