// Package pgtest gives tests a PostgreSQL database of their own: on the
// server IDEM_TEST_PG names, or on a throwaway cluster it starts from the
// installed PostgreSQL binaries and stops when the test binary ends. Tests
// of outages stop and start that cluster with Stop and Start, or crash
// and recover it at once with Restart.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names an existing server to test against instead of a throwaway
// cluster, e.g. "postgres://postgres@127.0.0.1:5432/postgres".
const EnvDSN = "IDEM_TEST_PG"

// EnvRequired, when set, makes a missing PostgreSQL fail the tests instead
// of skipping them: CI sets it, so that the PostgreSQL tests cannot
// silently not run.
const EnvRequired = "IDEM_PG_REQUIRED"

// Install says how to get PostgreSQL where it is missing.
const Install = "install PostgreSQL (Debian: apt-get install postgresql) or set " + EnvDSN + " to a server's DSN"

var (
	once    sync.Once
	admin   string           // DSN of the server's maintenance database
	server  func() *exec.Cmd // a new command that starts the throwaway cluster
	cluster *exec.Cmd        // the running server, nil while stopped
	dataDir string
	logPath string // the server's log, kept across restarts
	setup   error
)

// DSN returns the DSN of a new, empty database for t. The first call
// starts the server when IDEM_TEST_PG is not set. Where no PostgreSQL is
// installed it skips t with one line saying how to install it, or fails
// t when IDEM_PG_REQUIRED is set.
func DSN(t testing.TB) string {
	t.Helper()
	once.Do(func() { admin, setup = start() })
	if setup != nil {
		if errors.Is(setup, errNotInstalled) {
			cannotRun(t, "pgtest: no PostgreSQL: %s", Install)
		}
		t.Fatalf("pgtest: %v", setup)
	}
	name := "t_" + randomHex(8)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return withDatabase(admin, name)
}

// Main runs the tests and then stops the throwaway cluster, if one was
// started. Call it from TestMain: os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	stop()
	return code
}

var errNotInstalled = errors.New("PostgreSQL is not installed")

// withDatabase returns dsn with its database replaced by name.
func withDatabase(dsn, name string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return dsn
	}
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", cfg.User, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), name)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// start returns the maintenance DSN of the server to use, starting a
// throwaway cluster unless IDEM_TEST_PG names one.
func start() (string, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return dsn, nil
	}
	bin, err := binDir()
	if err != nil {
		return "", err
	}
	dataDir, err = os.MkdirTemp("", "idem-pgtest-")
	if err != nil {
		return "", err
	}
	// PostgreSQL refuses to run as root; tests that run as root run the
	// server as the postgres user, which must own its directory.
	cred, err := serverUser()
	if err != nil {
		return "", err
	}
	if cred != nil {
		if err := os.Chown(dataDir, int(cred.Uid), int(cred.Gid)); err != nil {
			return "", err
		}
	}
	data := filepath.Join(dataDir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %v: %s", err, lastLines(out))
	}
	port, err := freePort()
	if err != nil {
		return "", err
	}
	server = func() *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-h", "127.0.0.1", "-p", strconv.Itoa(port),
			"-k", dataDir, "-c", "max_connections=200", "-c", "shared_buffers=32MB")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
		return cmd
	}
	logPath = filepath.Join(dataDir, "server.log")
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if err := launch(dsn); err != nil {
		stop()
		return "", err
	}
	return dsn, nil
}

// launch starts the cluster with server's command, appending to its log, and
// returns once it accepts connections at dsn.
func launch(dsn string) error {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := server()
	if cred := cmd.SysProcAttr.Credential; cred != nil {
		os.Chown(logPath, int(cred.Uid), int(cred.Gid))
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %v", err)
	}
	cluster = cmd
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(context.Background(), dsn)
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres did not start: %v: %s", err, lastLines(log))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the throwaway cluster at once, as a crash would (immediate
// shutdown: SIGQUIT to the server), keeping its data; Start starts it
// again on the same port. Clients see their connections fail and new
// ones refused meanwhile. A test that stops the server must not run in
// parallel with other tests of its binary. When IDEM_TEST_PG names the
// server, which the tests do not own, Stop skips t, or fails it when
// IDEM_PG_REQUIRED is set. If t ends with the server stopped, it is
// started again.
func Stop(t testing.TB) {
	t.Helper()
	if !Restartable() {
		cannotRun(t, "pgtest: cannot stop the server %s names", EnvDSN)
	}
	if server == nil {
		t.Fatalf("pgtest: Stop before DSN started a server")
	}
	if cluster == nil {
		return
	}
	if err := halt(syscall.SIGQUIT); err != nil {
		t.Fatalf("pgtest: stop: %v", err)
	}
	t.Cleanup(func() {
		if cluster == nil {
			Start(t)
		}
	})
}

// Start starts the cluster Stop stopped and returns once it accepts
// connections. It does nothing while the cluster runs.
func Start(t testing.TB) {
	t.Helper()
	if server == nil {
		t.Fatalf("pgtest: Start before DSN started a server")
	}
	if cluster != nil {
		return
	}
	if err := launch(admin); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// halt sends sig to the running cluster and waits for it to exit.
func halt(sig syscall.Signal) error {
	cluster.Process.Signal(sig)
	done := make(chan error, 1)
	go func() { done <- cluster.Wait() }()
	var err error
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cluster.Process.Kill()
		<-done
		err = fmt.Errorf("postgres did not stop within 10s after %v; killed", sig)
	}
	cluster = nil
	return err
}

// stop stops the throwaway cluster by its PID (fast shutdown) and removes
// its directory.
func stop() {
	if cluster != nil && cluster.Process != nil {
		halt(syscall.SIGINT)
	}
	if dataDir != "" {
		os.RemoveAll(dataDir)
		dataDir = ""
	}
}

// binDir finds the newest installed PostgreSQL's binaries: Debian keeps
// them under /usr/lib/postgresql/VERSION/bin, off the PATH.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errNotInstalled
}

func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// serverUser returns the credential to run the server with: nil when the
// tests do not run as root, else the postgres user's.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a postgres user to run the server: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], "\n")
}

// cannotRun skips t, which cannot run here, saying why; or fails it when
// IDEM_PG_REQUIRED is set, so that a run that requires the PostgreSQL
// tests never passes without them.
func cannotRun(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv(EnvRequired) != "" {
		t.Fatalf(format+" ("+EnvRequired+" is set)", args...)
	}
	t.Skipf(format, args...)
}

// Restartable reports whether Stop, Start and Restart can act: only on a
// throwaway cluster that pgtest started itself, never on the server
// IDEM_TEST_PG names.
func Restartable() bool { return os.Getenv(EnvDSN) == "" }

// Owned skips t, or fails it when IDEM_PG_REQUIRED is set, unless the
// tests own the server: a test that changes the server's settings calls
// it, after DSN.
func Owned(t testing.TB) {
	t.Helper()
	if !Restartable() {
		cannotRun(t, "pgtest: the test changes the settings of the server %s names", EnvDSN)
	}
}

// Restart crashes the throwaway cluster in immediate mode and starts it
// again (Stop, then Start): every connection is cut, committed rows
// survive crash recovery, and it returns once the server accepts
// connections. Check Restartable first.
func Restart(t testing.TB) {
	t.Helper()
	Stop(t)
	Start(t)
}
