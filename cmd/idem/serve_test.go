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

// daemon is a running `idem serve` or `idem proxy` process.
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

// TestServeWalkthrough is the README's curl session, plus the ways a
// request can be refused without spending its key.
func TestServeWalkthrough(t *testing.T) {
	data := t.TempDir()
	d := startDaemon(t, "serve", "--data", data, "--addr", "127.0.0.1:0")
	assert.Equal(t, data, d.data)
	alice := []string{"Authorization", "Bearer sk_test_alice"}
	with := func(key string) []string { return append([]string{"Idempotency-Key", key}, alice...) }
	payments := d.url + "/v1/payments"

	// First call.
	k1 := newKey()
	first := send(t, "POST", payments, `{"amount": 4200, "currency": "usd", "customer": "cus_1"}`, with(k1)...)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	assert.Equal(t, k1, first.header.Get("Idempotency-Key"))
	assert.Empty(t, first.header.Get("Idempotent-Replayed"))
	pay := decode(t, first.body)
	id, _ := pay["id"].(string)
	assert.True(t, strings.HasPrefix(id, "pay_"), id)
	assert.Equal(t, "/v1/payments/"+id, first.header.Get("Location"))
	assert.EqualValues(t, 4200, pay["amount"])

	// Replay, with the members reordered and the amount spelt otherwise.
	again := send(t, "POST", payments, `{"customer":"cus_1","currency":"usd","amount":4.2e3}`, with(k1)...)
	assert.Equal(t, http.StatusCreated, again.status)
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(first.body), string(again.body))
	assert.Equal(t, first.header.Get("Location"), again.header.Get("Location"))

	// The same key for another amount.
	reuse := send(t, "POST", payments, `{"amount": 5000, "currency": "usd", "customer": "cus_1"}`, with(k1)...)
	assert.Equal(t, http.StatusUnprocessableEntity, reuse.status)
	assert.Equal(t, "idempotency_key_reuse", reuse.code(t))

	// The payment is there, for its own tenant only.
	got := send(t, "GET", payments+"/"+id, "", alice...)
	require.Equal(t, http.StatusOK, got.status, "%s", got.body)
	assert.Equal(t, id, decode(t, got.body)["id"])
	other := send(t, "GET", payments+"/"+id, "", "Authorization", "Bearer sk_test_bob")
	assert.Equal(t, http.StatusNotFound, other.status)
	assert.Equal(t, "payment_not_found", other.code(t))
	assert.Equal(t, "tenant_missing", send(t, "GET", payments+"/"+id, "").code(t))

	// Bob's request with Alice's key is his own operation.
	bob := send(t, "POST", payments, `{"amount": 4200, "currency": "usd", "customer": "cus_1"}`, "Idempotency-Key", k1, "Authorization", "Bearer sk_test_bob")
	require.Equal(t, http.StatusCreated, bob.status)
	assert.Empty(t, bob.header.Get("Idempotent-Replayed"))
	assert.NotEqual(t, id, decode(t, bob.body)["id"])

	// A refund, replayed, and seen on the payment.
	k2 := newKey()
	refund := send(t, "POST", d.url+"/v1/refunds", `{"payment": "`+id+`", "amount": 1000}`, with(k2)...)
	require.Equal(t, http.StatusCreated, refund.status, "%s", refund.body)
	assert.EqualValues(t, 1000, decode(t, refund.body)["amount"])
	refundAgain := send(t, "POST", d.url+"/v1/refunds", `{"amount": 1000, "payment": "`+id+`"}`, with(k2)...)
	assert.Equal(t, "true", refundAgain.header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(refund.body), string(refundAgain.body))
	assert.EqualValues(t, 1000, decode(t, send(t, "GET", payments+"/"+id, "", alice...).body)["amount_refunded"])

	// Refusals that committed nothing free the key: the fixed request
	// runs under the same key.
	k3 := newKey()
	for range 2 {
		missing := send(t, "POST", d.url+"/v1/refunds", `{"payment": "pay_nope"}`, with(k3)...)
		assert.Equal(t, http.StatusNotFound, missing.status)
		assert.Equal(t, "payment_not_found", missing.code(t))
		assert.Empty(t, missing.header.Get("Idempotent-Replayed"))
	}
	rest := send(t, "POST", d.url+"/v1/refunds", `{"payment": "`+id+`"}`, with(k3)...)
	require.Equal(t, http.StatusCreated, rest.status, "%s", rest.body)
	assert.EqualValues(t, 3200, decode(t, rest.body)["amount"])
	k4 := newKey()
	for _, body := range []string{`{"amount": -1, "currency": "usd", "customer": "cus_1"}`, `{"amount": 1, "currency": "USD", "customer": "cus_1"}`, `{"amount": 10.5, "currency": "usd", "customer": "cus_1"}`, `{"amount": 1, "currency": "usd"}`, `{"amount": 1, "currency": "usd", "customer": "c", "ammount": 2}`} {
		bad := send(t, "POST", payments, body, with(k4)...)
		assert.Equal(t, http.StatusBadRequest, bad.status, body)
		assert.Equal(t, "invalid_request", bad.code(t), body)
	}
	fixed := send(t, "POST", payments, `{"amount": 1, "currency": "usd", "customer": "cus_1"}`, with(k4)...)
	assert.Equal(t, http.StatusCreated, fixed.status, "%s", fixed.body)

	// The contract's own refusals.
	assert.Equal(t, "idempotency_key_missing", send(t, "POST", payments, `{}`, alice...).code(t))
	noAuth := send(t, "POST", payments, `{}`, "Idempotency-Key", newKey())
	assert.Equal(t, http.StatusUnauthorized, noAuth.status)
	assert.Equal(t, "tenant_missing", noAuth.code(t))

	// The records outlive the process; the in-memory payments do not.
	require.Equal(t, 0, d.stop(), d.stderr.String())
	d = startDaemon(t, "serve", "--data", data, "--addr", "127.0.0.1:0")
	after := send(t, "POST", d.url+"/v1/payments", `{"amount": 4200, "currency": "usd", "customer": "cus_1"}`, with(k1)...)
	assert.Equal(t, "true", after.header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(first.body), string(after.body))
	assert.Equal(t, http.StatusNotFound, send(t, "GET", d.url+"/v1/payments/"+id, "", alice...).status)
}

// TestServeInProgress shows 409 request_in_progress: with a slow provider,
// of two identical requests sent together one runs and the other is told
// to come back, and coming back replays the first one's payment.
func TestServeInProgress(t *testing.T) {
	// The delay only has to outlast the gap between two requests sent at
	// once; which of the two wins does not matter.
	d := startDaemon(t, "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--provider-delay", "1s")
	key := newKey()
	body := `{"amount": 4200, "currency": "usd", "customer": "cus_1"}`
	hdr := []string{"Idempotency-Key", key, "Authorization", "Bearer sk_test_alice"}
	replies := make(chan reply, 2)
	for range 2 {
		go func() {
			r, err := trySend(context.Background(), "POST", d.url+"/v1/payments", body, hdr...)
			assert.NoError(t, err)
			replies <- r
		}()
	}
	byStatus := map[int]reply{}
	for range 2 {
		r := <-replies
		byStatus[r.status] = r
	}
	require.Contains(t, byStatus, http.StatusCreated)
	require.Contains(t, byStatus, http.StatusConflict)
	busy := byStatus[http.StatusConflict]
	assert.Equal(t, "request_in_progress", busy.code(t))
	assert.NotEmpty(t, busy.header.Get("Retry-After"))

	retry := send(t, "POST", d.url+"/v1/payments", body, hdr...)
	assert.Equal(t, "true", retry.header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(byStatus[http.StatusCreated].body), string(retry.body))
}

func TestServeUsage(t *testing.T) {
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"unknown flag", []string{"--port", "80"}, 2, "flag provided but not defined"},
		{"argument", []string{"now"}, 2, `unexpected argument "now"`},
		{"negative delay", []string{"--provider-delay", "-1s"}, 2, "must not be negative"},
		{"no drain", []string{"--drain", "0s"}, 2, "--drain 0s must be positive"},
		{"bad address", []string{"--addr", "127.0.0.1:99999"}, 1, "idem serve:"},
		{"relative problem base", []string{"--problem-base", "errors/"}, 1, "Options.ProblemBase"},
		{"no stored body", []string{"--max-stored-body", "0"}, 2, "--max-stored-body 0 must be positive"},
		{"stored body over the store's cap", []string{"--max-stored-body", "2GiB"}, 2, "MaxBodyBytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runIdem(t, "", append([]string{"serve", "--data", t.TempDir()}, c.args...)...)
			assert.Equal(t, c.code, r.code)
			assert.Contains(t, r.stderr, c.stderr)
			assert.Empty(t, r.stdout)
		})
	}
	help := runIdem(t, "", "serve", "--help")
	assert.Equal(t, 0, help.code)
	assert.Contains(t, help.stderr, "kept in memory only")
}

func TestServeDataDirInUse(t *testing.T) {
	d := startDaemon(t, "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0")
	r := runIdem(t, "", "serve", "--data", d.data, "--addr", "127.0.0.1:0")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "another idem process holds it")
	assert.Empty(t, r.stdout)
}
