package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/idemtest"
)

// guard bounds every wait in these tests. It only turns a hang into a
// failure; nothing waits for it to pass.
const guard = 15 * time.Second

// daemon is a running `idem proxy` process.
type daemon struct {
	t    *testing.T
	cmd  *exec.Cmd
	url  string // http://host:port, read from the listen line
	data string

	mu      sync.Mutex
	stdout  []string // lines so far, guarded by mu
	changed chan struct{}
	stderr  syncBuffer
	done    chan struct{} // closed when the process has exited
	code    int           // exit status, once done is closed
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listenLine = regexp.MustCompile(`listening on (https?://\S+), data in (.+)$`)

// startDaemon runs the binary with args and returns once it has printed
// where it listens. The process is stopped with SIGTERM at the end of the
// test, and must then exit cleanly.
func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, cmd: exec.Command(binary, args...), changed: make(chan struct{}, 1), done: make(chan struct{})}
	out, err := d.cmd.StdoutPipe()
	require.NoError(t, err)
	d.cmd.Stderr = &d.stderr
	require.NoError(t, d.cmd.Start())
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			d.mu.Lock()
			d.stdout = append(d.stdout, sc.Text())
			d.mu.Unlock()
			select {
			case d.changed <- struct{}{}:
			default:
			}
		}
		err := d.cmd.Wait()
		d.code = d.cmd.ProcessState.ExitCode()
		if err != nil && d.code == 0 {
			d.code = -1
		}
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
			return
		default:
		}
		assert.Equal(t, 0, d.stop(), "exit status on SIGTERM; stderr:\n%s", d.stderr.String())
	})
	m := listenLine.FindStringSubmatch(d.waitLine("listening on"))
	require.NotNil(t, m)
	d.url, d.data = m[1], m[2]
	return d
}

// waitLine waits for a line of standard output containing s.
func (d *daemon) waitLine(s string) string {
	d.t.Helper()
	timeout := time.After(guard)
	for {
		d.mu.Lock()
		for _, l := range d.stdout {
			if strings.Contains(l, s) {
				d.mu.Unlock()
				return l
			}
		}
		d.mu.Unlock()
		select {
		case <-d.changed:
		case <-d.done:
			// The last lines may have arrived with the exit.
			d.mu.Lock()
			lines := strings.Join(d.stdout, "\n")
			d.mu.Unlock()
			if strings.Contains(lines, s) {
				continue
			}
			require.FailNowf(d.t, "daemon exited", "waiting for %q; exit %d\nstdout:\n%s\nstderr:\n%s", s, d.code, lines, d.stderr.String())
		case <-timeout:
			require.FailNowf(d.t, "timed out", "waiting for %q; stderr:\n%s", s, d.stderr.String())
		}
	}
}

// signal sends SIGTERM without waiting.
func (d *daemon) signal() {
	require.NoError(d.t, d.cmd.Process.Signal(syscall.SIGTERM))
}

// wait waits for the process to exit and returns its status.
func (d *daemon) wait() int {
	select {
	case <-d.done:
		return d.code
	case <-time.After(guard):
		d.cmd.Process.Kill()
		<-d.done
		d.t.Errorf("daemon did not exit in %s; stderr:\n%s", guard, d.stderr.String())
		return -1
	}
}

// stop sends SIGTERM and waits for the exit status.
func (d *daemon) stop() int {
	d.signal()
	return d.wait()
}

// reply is a response read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// problem decodes a problem document's code.
func (r reply) code(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "body: %s", r.body)
	var p struct{ Code string }
	require.NoError(t, json.Unmarshal(r.body, &p))
	return p.Code
}

var client = &http.Client{Timeout: guard}

// send makes a request; header is pairs of name, value, each added (so a
// name given twice is sent on two field lines).
func send(t *testing.T, method, url, body string, header ...string) reply {
	t.Helper()
	return sendCtx(t, context.Background(), method, url, body, header...)
}

func sendCtx(t *testing.T, ctx context.Context, method, url, body string, header ...string) reply {
	t.Helper()
	r, err := trySend(ctx, method, url, body, header...)
	require.NoError(t, err)
	return r
}

// trySend is send for goroutines and for requests expected to fail.
func trySend(ctx context.Context, method, url, body string, header ...string) (reply, error) {
	status, h, b, err := idemtest.Send(ctx, client, method, url, body, header...)
	return reply{status, h, b}, err
}

// newKey returns a fresh idempotency key.
func newKey() string { return rand.Text() }

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m), "%s", b)
	return m
}
