package localserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestFreePortCanBeBound(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("binding the port FreePort returned (%d): %v", port, err)
	}
	l.Close()
}

func TestChownTreeHandsEveryEntryOver(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a", "b", "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cred := &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: 1, Gid: 1} // daemon on Debian; any id works for root
	}
	if err := ChownTree(dir, cred); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "a"), filepath.Join(dir, "a", "b", "f")} {
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if sys.Uid != cred.Uid || sys.Gid != cred.Gid {
			t.Errorf("%s owned by %d:%d after ChownTree, want %d:%d", p, sys.Uid, sys.Gid, cred.Uid, cred.Gid)
		}
	}
	if err := ChownTree(filepath.Join(dir, "missing"), cred); err == nil {
		t.Error("ChownTree of a missing directory succeeded, want an error")
	}
}

func TestCredentialOfAMissingUserFailsWithoutCreate(t *testing.T) {
	cred, err := Credential(context.Background(), "exactly-no-such-user", false, nil)
	if os.Geteuid() != 0 {
		if cred != nil || err != nil {
			t.Fatalf("Credential as a non-root user = %v, %v; want nil, nil", cred, err)
		}
		return
	}
	if err == nil {
		t.Fatalf("Credential of a missing user without create = %v, want an error", cred)
	}
}
