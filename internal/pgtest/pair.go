package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pair is a primary and a standby that streams from it, two throwaway
// clusters of their own beside the one DSN starts, for tests of
// failover. DSN names both hosts with target_session_attrs=read-write,
// as a deployment with a standby does: connections reach whichever of
// the two takes writes.
type Pair struct {
	DSN              string
	primary, standby *node
}

// node is one server of a Pair.
type node struct {
	cmd  *exec.Cmd
	port int
	dir  string
}

// standbyName is the standby's application_name, which the primary's
// synchronous_standby_names lists when the pair is synchronous.
const standbyName = "idem_standby"

// NewPair starts a primary with database "idem" and a standby made from it
// with pg_basebackup, and returns once the standby streams (and, when sync
// is set, counts as the primary's synchronous standby: every commit is
// acknowledged once the standby has flushed it). Both are killed and
// removed when t ends. Without PostgreSQL it skips t, or fails it when
// IDEM_PG_REQUIRED is set; it never uses the server IDEM_TEST_PG names.
func NewPair(t testing.TB, sync bool) *Pair {
	t.Helper()
	bin, err := binDir()
	if err != nil {
		cannotRun(t, "pgtest: no PostgreSQL: %s", Install)
	}
	cred, err := serverUser()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	root, err := os.MkdirTemp("", "idem-pgpair-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	p := &Pair{}
	t.Cleanup(func() {
		for _, n := range []*node{p.primary, p.standby} {
			if n != nil {
				n.kill()
			}
		}
		os.RemoveAll(root)
	})
	if cred != nil {
		if err := os.Chown(root, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pgtest: %s: %v: %s", name, err, lastLines(out))
		}
	}
	mk := func(name string) *node {
		port, err := freePort()
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		return &node{port: port, dir: filepath.Join(root, name)}
	}
	p.primary, p.standby = mk("primary"), mk("standby")

	run("initdb", "-D", p.primary.dir, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
	p.primary.start(t, bin, cred)
	p.primary.exec(t, "CREATE DATABASE idem")

	run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(p.primary.port), "-U", "postgres",
		"-D", p.standby.dir, "-X", "stream", "-R", "--no-sync", "--checkpoint=fast")
	p.standby.start(t, bin, cred, "-c", fmt.Sprintf("primary_conninfo=host=127.0.0.1 port=%d user=postgres application_name=%s",
		p.primary.port, standbyName), "-c", "synchronous_standby_names=")
	want := "async"
	if sync {
		// Named only now: until the standby streams, commits would wait.
		p.primary.exec(t, "ALTER SYSTEM SET synchronous_standby_names = '"+standbyName+"'")
		p.primary.exec(t, "SELECT pg_reload_conf()")
		want = "sync"
	}
	p.primary.await(t, "the standby streaming as "+want,
		"SELECT count(*) = 1 FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = $1", want)

	p.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/idem?sslmode=disable&target_session_attrs=read-write",
		p.primary.port, p.standby.port)
	return p
}

// PrimaryDSN and StandbyDSN name one server each.
func (p *Pair) PrimaryDSN() string { return p.primary.dsn("idem") }
func (p *Pair) StandbyDSN() string { return p.standby.dsn("idem") }

// KillPrimary kills the primary's every process with SIGKILL, as a lost
// machine would stop it: nothing it had not sent the standby survives
// there.
func (p *Pair) KillPrimary(t testing.TB) {
	t.Helper()
	p.primary.kill()
}

// Promote makes the standby a primary and returns once it takes writes.
func (p *Pair) Promote(t testing.TB) {
	t.Helper()
	p.standby.exec(t, "SELECT pg_promote(true, 60)")
	p.standby.await(t, "the standby promoted", "SELECT NOT pg_is_in_recovery()")
}

func (n *node) dsn(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", n.port, db)
}

// start runs the server on n's directory with args, logging beside it,
// and returns once it accepts connections.
func (n *node) start(t testing.TB, bin string, cred *syscall.Credential, args ...string) {
	t.Helper()
	logf, err := os.Create(n.dir + ".log")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer logf.Close()
	if cred != nil {
		os.Chown(logf.Name(), int(cred.Uid), int(cred.Gid))
	}
	n.cmd = exec.Command(filepath.Join(bin, "postgres"), append([]string{"-D", n.dir, "-h", "127.0.0.1",
		"-p", strconv.Itoa(n.port), "-k", filepath.Dir(n.dir), "-c", "max_connections=100", "-c", "shared_buffers=16MB"}, args...)...)
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("pgtest: start postgres: %v", err)
	}
	n.await(t, "the server accepting connections", "SELECT true")
}

// kill ends n's process group with SIGKILL and waits for the server.
func (n *node) kill() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	n.cmd.Wait()
	n.cmd = nil
}

// exec runs sql on n's maintenance database.
func (n *node) exec(t testing.TB, sql string) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), n.dsn("postgres"))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), sql); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// await polls query, which returns one boolean, on n until it is true,
// for at most 30 seconds.
func (n *node) await(t testing.TB, what, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ok bool
		conn, err := pgx.Connect(t.Context(), n.dsn("postgres"))
		if err == nil {
			err = conn.QueryRow(t.Context(), query, args...).Scan(&ok)
			conn.Close(context.Background())
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(n.dir + ".log")
			t.Fatalf("pgtest: waited 30s for %s: %v: %s", what, err, lastLines(log))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
