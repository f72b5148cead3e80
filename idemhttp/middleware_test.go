package idemhttp_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	pubtest "github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/pebblestore"
)

func TestFirstCallThenReplay(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	first, body1 := e.call("POST", "/v1/payments", "acme", pay, "key-1")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Empty(t, first.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "key-1", first.Header.Get("Idempotency-Key"))

	again, body2 := e.call("POST", "/v1/payments", "acme", pay, "key-1")
	assert.Equal(t, http.StatusCreated, again.StatusCode)
	assert.Equal(t, body1, body2, "the body is replayed byte for byte")
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "key-1", again.Header.Get("Idempotency-Key"))
	for _, h := range []string{"Content-Type", "X-Run"} {
		assert.Equal(t, first.Header.Get(h), again.Header.Get(h), h)
	}
	assert.Equal(t, first.Header.Values("Link"), again.Header.Values("Link"))
	assert.Empty(t, again.Header.Get("Connection"), "hop-by-hop headers are not replayed")
	assert.Equal(t, int64(1), e.app.runs.Load())

	rec, err := e.db.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "key-1"})
	require.NoError(t, err)
	assert.NotContains(t, rec.Response.Header, "Connection")
	assert.NotContains(t, rec.Response.Header, "Idempotency-Key")
}

func TestEquivalentBodiesReplay(t *testing.T) {
	e := setup(t, idemhttp.Options{Canonical: idem.CanonicalOptions{Volatile: []string{"/client_ts"}}})
	_, body1 := e.call("POST", "/v1/payments", "acme", `{"amount":4200,"currency":"usd","client_ts":1}`, "k")
	for _, same := range []string{
		`{"currency":"usd","amount":4200,"client_ts":2}`,
		`{ "amount" : 4.2e3, "currency" : "usd" }`,
		`{"amount":4200.000,"currency":"u\u0073d"}`,
	} {
		resp, body := e.call("POST", "/v1/payments", "acme", same, "k")
		assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), same)
		assert.Equal(t, body1, body, same)
	}
	assert.Equal(t, int64(1), e.app.runs.Load())
}

func TestChangedPayloadIsRefused(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.call("POST", "/v1/payments", "acme", pay, "k")
	resp, body := e.call("POST", "/v1/payments", "acme", `{"amount":4201,"currency":"usd","customer":"cus_1"}`, "k")
	assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	assert.Equal(t, idem.CodeKeyReuse, problem(t, resp, body).Code)
	assert.Equal(t, "k", resp.Header.Get("Idempotency-Key"))
	assert.Equal(t, int64(1), e.app.runs.Load())

	// The same key on another route is another scope, and the original is
	// untouched.
	resp, _ = e.call("POST", "/v1/refunds", "acme", `{"amount":4201}`, "k")
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	resp, _ = e.call("POST", "/v1/payments", "acme", pay, "k")
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
}

func TestMismatchStatusIsConfigurable(t *testing.T) {
	e := setup(t, idemhttp.Options{MismatchStatus: http.StatusConflict})
	e.call("POST", "/v1/payments", "acme", pay, "k")
	resp, body := e.call("POST", "/v1/payments", "acme", `{}`, "k")
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Equal(t, idem.CodeKeyReuse, problem(t, resp, body).Code)
}

func TestOtherRefusals(t *testing.T) {
	e := setup(t, idemhttp.Options{MaxRequestBytes: 64})
	resp, body := e.call("POST", "/v1/payments", "", pay, "k")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Equal(t, idem.CodeTenantMissing, problem(t, resp, body).Code)

	resp, body = e.call("POST", "/v1/payments", strings.Repeat("t", idem.MaxTenantBytes+1), pay, "k")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	p := problem(t, resp, body)
	assert.Equal(t, idem.CodeTenantMissing, p.Code, "a tenant too long to store is the credential's fault, not the key's")
	assert.Contains(t, p.Detail, "more than 255")
	assert.Zero(t, e.app.runs.Load())

	// What the Tenant function says is the service's business: it may
	// name a host or a table, so the client gets the middleware's words.
	leaky := setup(t, idemhttp.Options{Tenant: func(*http.Request) (string, error) {
		return "", errors.New("accounts db at 10.0.0.5:5432: connection refused")
	}})
	resp, body = leaky.call("POST", "/v1/payments", "acme", pay, "k")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	p = problem(t, resp, body)
	assert.Equal(t, idem.CodeTenantMissing, p.Code)
	assert.NotContains(t, p.Detail, "10.0.0.5")

	resp, body = e.call("POST", "/v1/payments", "acme", `{"amount":`+strings.Repeat("1", 100)+`}`, "k")
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	assert.Equal(t, idem.CodePayloadTooLarge, problem(t, resp, body).Code)

	resp, body = e.call("POST", "/v1/payments", "acme", `{"a":1,"a":2}`, "k")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	p = problem(t, resp, body)
	assert.Equal(t, idem.CodeBodyInvalid, p.Code)
	assert.Equal(t, "duplicate_member", p.BodyError)
	require.NotNil(t, p.BodyOffset)

	assert.Zero(t, e.app.runs.Load())
	m, err := e.db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Zero(t, m.Events[idem.EventClaimed])
}

// TestMaxRequestBytesIsTheOnlyBodyLimit: the body's limit is
// MaxRequestBytes alone. A body over the canonicalizer's default limit but
// under MaxRequestBytes is fingerprinted and runs, and a second limit in
// Options.Canonical is refused at construction, naming the one to use.
func TestMaxRequestBytesIsTheOnlyBodyLimit(t *testing.T) {
	e := setup(t, idemhttp.Options{MaxRequestBytes: 2 << 20})
	big := `{"memo":"` + strings.Repeat("m", 3<<19) + `"}` // 1.5 MiB
	resp, _ := e.call("POST", "/v1/payments", "acme", big, "big")
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	resp, body := e.call("POST", "/v1/payments", "acme", big+strings.Repeat(" ", 1<<19), "bigger")
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	assert.Contains(t, problem(t, resp, body).Detail, "larger than 2097152 bytes")

	_, err := idemhttp.New(idemhttp.Options{Store: e.db, Tenant: bearer,
		Canonical: idem.CanonicalOptions{MaxBytes: 4 << 20}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Options.Canonical.MaxBytes")
	assert.Contains(t, err.Error(), "set Options.MaxRequestBytes")
}

// TestRefusalsNameTheirCause: a path too long to store and a body over an
// outer http.MaxBytesReader are the request's faults, reported as such
// and not as a bad key or a malformed body.
func TestRefusalsNameTheirCause(t *testing.T) {
	e := setup(t, idemhttp.Options{}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/capped" {
				r.Body = http.MaxBytesReader(w, r.Body, 10)
			}
			next.ServeHTTP(w, r)
		})
	})

	resp, body := e.call("POST", "/v1/"+strings.Repeat("a", idem.MaxEndpointBytes), "acme", pay, "k")
	assert.Equal(t, http.StatusRequestURITooLong, resp.StatusCode)
	p := problem(t, resp, body)
	assert.Equal(t, idem.CodeURITooLong, p.Code)
	assert.Contains(t, p.Detail, "more than 1024")

	resp, body = e.call("POST", "/capped", "acme", pay, "k")
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	p = problem(t, resp, body)
	assert.Equal(t, idem.CodePayloadTooLarge, p.Code)
	assert.Contains(t, p.Detail, "larger than 10 bytes")

	assert.Zero(t, e.app.runs.Load())
	m, err := e.db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Zero(t, m.Events[idem.EventClaimed])
}

func TestGetPassesThrough(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	for range 2 {
		resp, _ := e.call("GET", "/v1/payments/pay_1", "acme", "")
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Empty(t, resp.Header.Get("Idempotent-Replayed"))
	}
	assert.Equal(t, int64(2), e.app.runs.Load(), "reads run every time")
}

// TestKeyedUnsafeMethodIsProtected: Options.Methods decides where a key is
// mandatory, not which keys count. An unsafe request that carries one is
// run once whatever its method; without one it passes through, and a safe
// method passes through even with a key.
func TestKeyedUnsafeMethodIsProtected(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	for _, method := range []string{"PATCH", "PUT", "DELETE"} {
		t.Run(method, func(t *testing.T) {
			before := e.app.runs.Load()
			first, body := e.call(method, "/v1/payments/pay_1", "acme", pay, "k-"+method)
			require.Equal(t, http.StatusCreated, first.StatusCode)
			again, replayed := e.call(method, "/v1/payments/pay_1", "acme", pay, "k-"+method)
			assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
			assert.Equal(t, body, replayed)
			assert.Equal(t, before+1, e.app.runs.Load(), "the keyed retry is a replay")

			resp, body := e.call(method, "/v1/payments/pay_1", "acme", `{"amount":1}`, "k-"+method)
			assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
			assert.Equal(t, idem.CodeKeyReuse, problem(t, resp, body).Code)

			resp, _ = e.call(method, "/v1/payments/pay_1", "acme", pay)
			assert.Equal(t, http.StatusCreated, resp.StatusCode, "no key, and none required")
			assert.Equal(t, before+2, e.app.runs.Load())
		})
	}
	t.Run("a malformed key is refused", func(t *testing.T) {
		resp, body := e.call("PATCH", "/v1/payments/pay_1", "acme", pay, "a b")
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, idem.CodeKeyInvalid, problem(t, resp, body).Code)
	})
	t.Run("safe methods pass through", func(t *testing.T) {
		for _, method := range []string{"GET", "HEAD", "OPTIONS", "TRACE"} {
			before := e.app.runs.Load()
			for range 2 {
				resp, _ := e.call(method, "/v1/payments/pay_1", "acme", "", "safe-"+method)
				assert.Empty(t, resp.Header.Get("Idempotent-Replayed"), method)
			}
			assert.Equal(t, before+2, e.app.runs.Load(), method)
		}
	})
}

// TestSlowBodyIs408: a body that stops arriving before the server's read
// deadline is the client's timeout, not a malformed body, and the answer
// names no socket address. Nothing is claimed, so a retry runs.
func TestSlowBodyIs408(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	srv := httptest.NewUnstartedServer(e.srv.Config.Handler)
	srv.Config.ReadTimeout = 500 * time.Millisecond // ample for the header, which is sent at once
	srv.Start()
	t.Cleanup(srv.Close)

	resp, body := rawRequest(t, srv.Listener.Addr().String(),
		"Idempotency-Key: slow\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"amount\":")

	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	p := problem(t, resp, body)
	assert.Equal(t, idem.CodeRequestTimeout, p.Code)
	assert.NotContains(t, p.Detail, "127.0.0.1")
	assert.NotContains(t, p.Detail, "tcp")
	assert.Zero(t, e.app.runs.Load())
	m, err := e.db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Zero(t, m.Events[idem.EventClaimed], "nothing was claimed")
}

// rawRequest sends, on a connection of its own to addr, a POST of a
// payment by tenant acme whose remaining headers and body are rest, as
// bytes no client library would alter, and returns the answer and its
// body.
func rawRequest(t *testing.T, addr, rest string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = io.WriteString(conn, "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer acme\r\n"+rest)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

// TestExpectContinueOverLimitIsRefusedFirst: a body whose declared length
// is over MaxRequestBytes is refused before it is read, so a client that
// waits for 100 Continue gets 413 instead and never sends it.
func TestExpectContinueOverLimitIsRefusedFirst(t *testing.T) {
	e := setup(t, idemhttp.Options{MaxRequestBytes: 1000})
	resp, body := rawRequest(t, e.srv.Listener.Addr().String(),
		"Idempotency-Key: big\r\nContent-Type: application/json\r\nContent-Length: 1001\r\nExpect: 100-continue\r\n\r\n")
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "no 100 Continue first")
	p := problem(t, resp, body)
	assert.Equal(t, idem.CodePayloadTooLarge, p.Code)
	assert.Equal(t, "the request body is larger than 1000 bytes", p.Detail)
	assert.Zero(t, e.app.runs.Load())

	resp, _ = e.callWith(http.Header{"Expect": {"100-continue"}}, "POST", "/v1/payments", "acme", pay, "small")
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "a body within the limit is still read")
}

// TestUnreadableBodyNamesNoAddress: a body that fails to arrive for any
// other reason is refused with a detail that says so and no more.
func TestUnreadableBodyNamesNoAddress(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	req := e.request(nil, "POST", "/v1/payments", "acme", "", "broken")
	addr := &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 4567}
	req.Body = io.NopCloser(iotest.ErrReader(&net.OpError{Op: "read", Net: "tcp", Source: addr, Addr: addr, Err: syscall.ECONNRESET}))
	w := e.serve(req)
	assert.Equal(t, http.StatusBadRequest, w.Code)
	p := problem(t, w.Result(), w.Body.String())
	assert.Equal(t, idem.CodeBodyInvalid, p.Code)
	assert.NotContains(t, p.Detail, "10.1.2.3")
	assert.Zero(t, e.app.runs.Load())
}

func TestTenantsStayApart(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	_, a := e.call("POST", "/v1/payments", "tenant-a", pay, "same-key")
	resp, b := e.call("POST", "/v1/payments", "tenant-b", `{"amount":1}`, "same-key")
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Idempotent-Replayed"), "tenant b never sees tenant a's record")
	assert.NotEqual(t, a, b)
	assert.Equal(t, int64(2), e.app.runs.Load())
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	release := make(chan struct{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay_once"}`)
	}
	const n = 50
	var wg sync.WaitGroup
	statuses := make(chan int, n)
	retryAfter := make(chan string, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := e.call("POST", "/v1/payments", "acme", pay, "dup")
			statuses <- resp.StatusCode
			if resp.StatusCode == http.StatusConflict {
				retryAfter <- resp.Header.Get("Retry-After")
			}
		}()
	}
	// The 49 losers are answered while the winner is still held.
	for range n - 1 {
		assert.Equal(t, http.StatusConflict, <-statuses)
		assert.Equal(t, "1", <-retryAfter)
	}
	close(release)
	wg.Wait()
	assert.Equal(t, http.StatusCreated, <-statuses)
	assert.Equal(t, int64(1), e.app.runs.Load())
	resp, body := e.call("POST", "/v1/payments", "acme", pay, "dup")
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, `{"id":"pay_once"}`, body)
}

func TestWaitForInFlightDuplicate(t *testing.T) {
	e := setup(t, idemhttp.Options{Wait: time.Minute})
	started, release := make(chan struct{}), make(chan struct{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		io.WriteString(w, "done")
	}
	first := make(chan string)
	go func() { _, b := e.call("POST", "/v1/payments", "acme", pay, "w"); first <- b }()
	<-started
	second := make(chan *http.Response)
	go func() { r, _ := e.call("POST", "/v1/payments", "acme", pay, "w"); second <- r }()
	// The second request is parked in the store's Wait, woken by the end of
	// the first; the minute-long bound is never reached.
	close(release)
	assert.Equal(t, "done", <-first)
	resp := <-second
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(1), e.app.runs.Load())
}

func TestHandlerDeclaresOutcome(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	var mode atomic.Value
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "release":
			idemhttp.Release(r)
			w.WriteHeader(http.StatusBadRequest)
		case "unknown":
			idemhttp.MarkUnknown(r)
			w.WriteHeader(http.StatusGatewayTimeout)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}
	mode.Store("release")
	resp, _ := e.call("POST", "/v1/payments", "acme", pay, "r")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	mode.Store("ok")
	resp, _ = e.call("POST", "/v1/payments", "acme", pay, "r")
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "a released key runs again")
	assert.Empty(t, resp.Header.Get("Idempotent-Replayed"))

	mode.Store("unknown")
	e.call("POST", "/v1/payments", "acme", pay, "u")
	mode.Store("ok")
	resp, body := e.call("POST", "/v1/payments", "acme", pay, "u")
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	p := problem(t, resp, body)
	assert.Equal(t, idem.CodeOutcomePending, p.Code)
	assert.Contains(t, p.Detail, "may or may not have taken effect")
	assert.Contains(t, p.Detail, "until the service's operator resolves it (idem resolve")
	assert.NotContains(t, p.Detail, "being reconciled", "nothing may be reconciling it")
	assert.Equal(t, int64(3), e.app.runs.Load(), "an unknown outcome is never re-run")
}

// TestOverdueClaimAnswer: a retry that finds a claim past its lease is told
// to come back when a reconciler looks such claims up, and that an operator
// must resolve it when none does; unknown records always need the operator.
func TestOverdueClaimAnswer(t *testing.T) {
	for _, c := range []struct {
		name          string
		every         time.Duration
		code, contain string
		retryAfter    string
	}{
		{"no reconciler", 0, idem.CodeOutcomePending, "stopped before its outcome was recorded, so it may or may not have taken effect; " +
			"every retry with this key gets this answer until the service's operator resolves it (idem resolve)", ""},
		{"reconciler", time.Minute, idem.CodeInProgress, "the service is finding out what became of it; retry with the same key later", "60"},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := &pebblestore.Options{Logger: discardLogger(), SweepInterval: c.every}
			if c.every > 0 {
				// The loop never comes round within the test: the store
				// only has to say that a reconciler is at work.
				opts.Reconcile = func(context.Context, idem.Lease) error { return nil }
			}
			db, clock := idemtest.Open(t, opts)
			crashed := setup(t, idemhttp.Options{Store: pubtest.Forgetful(db)})
			resp, _ := crashed.call("POST", "/v1/payments", "acme", pay, "k")
			require.Equal(t, http.StatusCreated, resp.StatusCode)

			e := setup(t, idemhttp.Options{Store: db})
			clock.Advance(time.Hour) // past the lease, within the TTL
			resp, body := e.call("POST", "/v1/payments", "acme", pay, "k")
			assert.Equal(t, http.StatusConflict, resp.StatusCode)
			p := problem(t, resp, body)
			assert.Equal(t, c.code, p.Code)
			assert.Contains(t, p.Detail, c.contain)
			assert.NotContains(t, p.Detail, "reconcil", "the detail names no mechanism the client cannot see")
			assert.Equal(t, c.retryAfter, resp.Header.Get("Retry-After"))
			assert.Zero(t, e.app.runs.Load(), "an overdue claim is never re-run blindly")

			// The same service with an unknown record: only an operator
			// settles it, reconciler or not.
			e.app.handler = func(w http.ResponseWriter, r *http.Request) {
				idemhttp.MarkUnknown(r)
				w.WriteHeader(http.StatusGatewayTimeout)
			}
			e.call("POST", "/v1/payments", "acme", pay, "u")
			resp, body = e.call("POST", "/v1/payments", "acme", pay, "u")
			assert.Equal(t, http.StatusConflict, resp.StatusCode)
			p = problem(t, resp, body)
			assert.Equal(t, idem.CodeOutcomePending, p.Code)
			assert.Contains(t, p.Detail, "until the service's operator resolves it (idem resolve)")
			assert.Empty(t, resp.Header.Get("Retry-After"))
		})
	}
}

// TestOutcomePolicy: the statuses Options.Outcomes lists free the key or
// leave it unknown, every other one is stored, and the handler's own word
// wins over the policy.
func TestOutcomePolicy(t *testing.T) {
	e := setup(t, idemhttp.Options{Outcomes: idemhttp.OutcomePolicy{Release: []int{429, 503}, Unknown: []int{504}}})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		status, _ := strconv.Atoi(r.Header.Get("X-Status"))
		if r.Header.Get("X-Keep") != "" {
			idemhttp.Keep(r)
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, "run %d", e.app.runs.Load())
	}
	send := func(key, status string, keep bool) (*http.Response, string) {
		h := http.Header{"X-Status": {status}}
		if keep {
			h.Set("X-Keep", "1")
		}
		return e.callWith(h, "POST", "/v1/payments", "acme", pay, key)
	}

	resp, body := send("released", "429", false)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "run 1", body)
	resp, body = send("released", "201", false)
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "a released key runs again")
	assert.Equal(t, "run 2", body)

	send("unknown", "504", false)
	resp, body = send("unknown", "201", false)
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Equal(t, idem.CodeOutcomePending, problem(t, resp, body).Code)

	send("stored", "500", false)
	resp, body = send("stored", "201", false)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "a status the policy does not list is replayed")
	assert.Equal(t, "true", resp.Header.Get(idem.HeaderReplayed))
	assert.Equal(t, "run 4", body)

	send("kept", "503", true)
	resp, body = send("kept", "201", false)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "Keep wins over the policy")
	assert.Equal(t, "true", resp.Header.Get(idem.HeaderReplayed))
	assert.Equal(t, "run 5", body)
	assert.Equal(t, int64(5), e.app.runs.Load())
}

// TestRawFallback: with RawFallback, a body the canonicalizer refuses is
// fingerprinted as its bytes, so its retry replays and any other bytes
// are another request; without it, the body is refused.
func TestRawFallback(t *testing.T) {
	const dup = `{"amount":1,"amount":2}`
	strict := setup(t, idemhttp.Options{})
	resp, body := strict.call("POST", "/v1/payments", "acme", dup, "k")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, "duplicate_member", problem(t, resp, body).BodyError)

	e := setup(t, idemhttp.Options{RawFallback: true})
	first, firstBody := e.call("POST", "/v1/payments", "acme", dup, "k")
	assert.Equal(t, http.StatusCreated, first.StatusCode)
	resp, body = e.call("POST", "/v1/payments", "acme", dup, "k")
	assert.Equal(t, "true", resp.Header.Get(idem.HeaderReplayed))
	assert.Equal(t, firstBody, body)
	resp, _ = e.call("POST", "/v1/payments", "acme", `{"amount":1, "amount":2}`, "k")
	assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "other bytes are another request")

	form := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	resp, _ = e.callWith(form, "POST", "/v1/payments", "acme", "a=100%", "f")
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	resp, _ = e.callWith(form, "POST", "/v1/payments", "acme", "a=100%", "f")
	assert.Equal(t, "true", resp.Header.Get(idem.HeaderReplayed))
	assert.Equal(t, int64(2), e.app.runs.Load())
	assert.Zero(t, strict.app.runs.Load())
}

func TestPanicRecordsUnknownAndPropagates(t *testing.T) {
	var seen []idem.Observation
	e := setup(t, idemhttp.Options{Observe: func(o idem.Observation) { seen = append(seen, o) }})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) { panic("boom") }
	req := e.request(nil, "POST", "/v1/payments", "acme", pay, "p")
	assert.PanicsWithValue(t, "boom", func() { e.serve(req) })
	rec, err := e.db.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "p"})
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State)
	require.Len(t, seen, 1, "a panicking request is still observed")
	assert.Equal(t, idem.OutcomePanic, seen[0].Outcome)
	assert.Equal(t, http.StatusInternalServerError, seen[0].Status)
}

// TestEncodedBodyIsHashedAsSent: a compressed JSON body is not JSON text.
// The middleware hashes the bytes as they came, with their coding, and
// hands them to the handler unchanged; it never answers 400 for a body
// the handler can read.
func TestEncodedBodyIsHashedAsSent(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		zr, err := gzip.NewReader(r.Body)
		if !assert.NoError(t, err) {
			return
		}
		b, err := io.ReadAll(zr)
		assert.NoError(t, err)
		w.WriteHeader(http.StatusCreated)
		w.Write(b)
	}
	gzipped := func(s string) string {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		io.WriteString(zw, s)
		require.NoError(t, zw.Close())
		return b.String()
	}
	post := func(body string) (*http.Response, string) {
		return e.callWith(http.Header{"Content-Encoding": {"gzip"}}, "POST", "/v1/payments", "acme", body, "gz")
	}
	first := gzipped(pay)
	resp, body := post(first)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	assert.Equal(t, pay, body)

	resp, body = post(first)
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, pay, body)

	resp, body = post(gzipped(`{"amount":1}`))
	assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	assert.Equal(t, idem.CodeKeyReuse, problem(t, resp, body).Code)
	assert.Equal(t, int64(1), e.app.runs.Load())
}

// TestGoexitRecordsUnknown: a handler that ends its goroutine instead of
// returning (runtime.Goexit, as t.FailNow does) may have done anything, as
// after a panic, and recover sees no value.
func TestGoexitRecordsUnknown(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) { runtime.Goexit() }
	req := e.request(nil, "POST", "/v1/payments", "acme", pay, "g")
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.serve(req)
	}()
	<-done
	rec, err := e.db.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "g"})
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State)
}

func TestClientDisconnectDoesNotCancelTheHandler(t *testing.T) {
	outer := make(chan context.Context, 1)
	started := make(chan struct{})
	gone := make(chan struct{})
	handlerErr := make(chan error, 1)
	e := setup(t, idemhttp.Options{}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			outer <- r.Context()
			next.ServeHTTP(w, r)
		})
	})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-gone // the server has seen the client leave
		handlerErr <- r.Context().Err()
		io.WriteString(w, "charged")
	}

	ctx, cancel := context.WithCancel(context.Background())
	req := e.request(nil, "POST", "/v1/payments", "acme", pay, "gone").WithContext(ctx)
	go func() {
		connCtx := <-outer
		// Leave only once the middleware has read the whole body: a client
		// that leaves mid-upload gets 400 and the handler never runs.
		<-started
		cancel()
		<-connCtx.Done()
		close(gone)
	}()
	_, err := e.srv.Client().Do(req)
	require.Error(t, err)
	require.NoError(t, <-handlerErr, "the handler's context must outlive the client")

	scope := idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "gone"}
	require.NoError(t, e.db.Wait(context.Background(), scope))
	rec, err := e.db.Get(context.Background(), scope)
	require.NoError(t, err)
	assert.Equal(t, idem.StateCompleted, rec.State)
	assert.Equal(t, "charged", string(rec.Response.Body), "the retry will find the whole result")
}

// TestClockBehindIs503 steps the store's clock back past its tolerance:
// the request gets 503 clock_behind with Retry-After, the handler does
// not run and nothing is stored; once the clock is right it runs.
func TestClockBehindIs503(t *testing.T) {
	db, clock := idemtest.Open(t, &pebblestore.Options{Logger: discardLogger()})
	e := setup(t, idemhttp.Options{Store: db})
	resp, _ := e.call("POST", "/v1/payments", "acme", pay, "first")
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	clock.Advance(-time.Minute)
	resp, body := e.call("POST", "/v1/payments", "acme", pay, "k")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	p := problem(t, resp, body)
	assert.Equal(t, idem.CodeClockBehind, p.Code)
	assert.Equal(t, idemhttp.DefaultProblemBase+idem.CodeClockBehind, p.Type)
	assert.Equal(t, "5", resp.Header.Get("Retry-After"))
	assert.Equal(t, int64(1), e.app.runs.Load(), "nothing ran")
	_, err := db.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "k"})
	require.ErrorIs(t, err, idem.ErrNotFound, "nothing was stored")

	clock.Advance(time.Minute)
	resp, _ = e.call("POST", "/v1/payments", "acme", pay, "k")
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, int64(2), e.app.runs.Load())
}

func TestStoreFailureIs503(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	require.NoError(t, e.db.Close())
	resp, body := e.call("POST", "/v1/payments", "acme", pay, "k")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, idem.CodeStoreUnavailable, problem(t, resp, body).Code)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	assert.Zero(t, e.app.runs.Load())
}

// TestExpiryHeader: a stored answer and each replay of it say when the
// key expires; an answer that was not stored says nothing of the kind.
func TestExpiryHeader(t *testing.T) {
	db, _ := idemtest.Open(t, &pebblestore.Options{EndpointTTL: map[string]time.Duration{"POST /v1/refunds": time.Hour}})
	e := setup(t, idemhttp.Options{Store: db})
	first, _ := e.call("POST", "/v1/refunds", "acme", pay, "k")
	rec, err := db.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/refunds", Key: "k"})
	require.NoError(t, err)
	want := rec.ExpiresAt.UTC().Format(http.TimeFormat)
	assert.Equal(t, want, first.Header.Get(idem.HeaderExpires))
	replay, _ := e.call("POST", "/v1/refunds", "acme", pay, "k")
	assert.Equal(t, "true", replay.Header.Get(idem.HeaderReplayed))
	assert.Equal(t, []string{want}, replay.Header.Values(idem.HeaderExpires))
	stored, err := time.Parse(http.TimeFormat, want)
	require.NoError(t, err)
	assert.Equal(t, rec.ExpiresAt.Truncate(time.Second).Unix(), stored.Unix())

	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("X-Empty") != "":
			return // net/http answers 200 with no body
		case r.Header.Get("X-Stream") != "":
			io.WriteString(w, "first part ")
			http.NewResponseController(w).Flush()
			io.WriteString(w, "second part")
			return
		}
		idemhttp.Release(r)
		w.WriteHeader(http.StatusTooManyRequests)
	}
	released, _ := e.call("POST", "/v1/refunds", "acme", pay, "released")
	assert.Equal(t, http.StatusTooManyRequests, released.StatusCode)
	assert.Empty(t, released.Header.Get(idem.HeaderExpires), "a released key has no expiry")
	empty, _ := e.callWith(http.Header{"X-Empty": {"1"}}, "POST", "/v1/refunds", "acme", pay, "empty")
	assert.Equal(t, http.StatusOK, empty.StatusCode)
	assert.NotEmpty(t, empty.Header.Get(idem.HeaderExpires), "an answer without a status written is stored too")

	stream := http.Header{"X-Stream": {"1"}}
	streamed, body := e.callWith(stream, "POST", "/v1/refunds", "acme", pay, "streamed")
	assert.Equal(t, "first part second part", body)
	assert.NotEmpty(t, streamed.Header.Get(idem.HeaderExpires), "a streamed answer carries it from its start")
	replay, _ = e.callWith(stream, "POST", "/v1/refunds", "acme", pay, "streamed")
	assert.Equal(t, "true", replay.Header.Get(idem.HeaderReplayed))
	assert.Equal(t, streamed.Header.Get(idem.HeaderExpires), replay.Header.Get(idem.HeaderExpires))
}

// TestRouteTTL: a route's TTL is the store's, set per endpoint as the
// middleware names it.
func TestRouteTTL(t *testing.T) {
	db, _ := idemtest.Open(t, &pebblestore.Options{EndpointTTL: map[string]time.Duration{"POST /v1/refunds": time.Hour}})
	e := setup(t, idemhttp.Options{Store: db})
	e.call("POST", "/v1/refunds", "acme", pay, "k")
	rec, err := db.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/refunds", Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, time.Hour, rec.ExpiresAt.Sub(rec.CreatedAt))
}

func TestOptionsValidation(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	_, err := idemhttp.New(idemhttp.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Store is required")
	assert.Contains(t, err.Error(), "Tenant is required")
	_, err = idemhttp.New(idemhttp.Options{
		Store: db, Tenant: bearer, Methods: []string{"post"}, KeyAlphabet: "ab c", MaxKeyLength: 300,
		Wait: -1, MismatchStatus: 500, MaxRequestBytes: -1, MaxDecodedBytes: -1,
		Canonical: idem.CanonicalOptions{Volatile: []string{"no-slash"}},
		Aliases:   []string{"X-Idempotency-Key", "idempotency-key"},
		Outcomes:  idemhttp.OutcomePolicy{Release: []int{429, 503}, Unknown: []int{503, 42}},
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, idem.ErrInvalidOptions)
	assert.Contains(t, err.Error(), `Options.Aliases: "idempotency-key" is the same header as "Idempotency-Key"`)
	assert.NotContains(t, err.Error(), "X-Idempotency-Key")
	assert.Contains(t, err.Error(), "status 503 is in both Release and Unknown")
	assert.Contains(t, err.Error(), "status 42 is not a final status")
	for _, want := range []string{"Methods", "KeyAlphabet", "MaxKeyLength", "Wait", "MismatchStatus", "Canonical", "MaxRequestBytes -1", "MaxDecodedBytes -1"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestObserveReportsEachOutcome(t *testing.T) {
	seen := make(chan idem.Observation, 8)
	e := setup(t, idemhttp.Options{Observe: func(o idem.Observation) { seen <- o }})
	next := func() idem.Observation {
		select {
		case o := <-seen:
			return o
		default:
			t.Fatal("the middleware answered without calling Observe first")
			return idem.Observation{}
		}
	}
	steps := []struct {
		method, path, body, key string
		outcome                 string
		status                  int
	}{
		{"POST", "/v1/payments", pay, "obs-1", idem.OutcomeExecuted, http.StatusCreated},
		{"POST", "/v1/payments", pay, "obs-1", idem.OutcomeReplayed, http.StatusCreated},
		{"POST", "/v1/payments", `{"amount":1}`, "obs-1", idem.CodeKeyReuse, http.StatusUnprocessableEntity},
		{"POST", "/v1/refunds", pay, "", idem.CodeKeyMissing, http.StatusBadRequest},
		{"POST", "/v1/refunds", `{"a":`, "obs-2", idem.CodeBodyInvalid, http.StatusBadRequest},
	}
	for _, s := range steps {
		var keys []string
		if s.key != "" {
			keys = append(keys, s.key)
		}
		resp, _ := e.call(s.method, s.path, "acme", s.body, keys...)
		require.Equal(t, s.status, resp.StatusCode)
		o := next()
		assert.Equal(t, "POST "+s.path, o.Endpoint)
		assert.Equal(t, s.outcome, o.Outcome)
		assert.Equal(t, s.status, o.Status)
		assert.Positive(t, o.Duration)
	}
	// Requests that need no key pass through unobserved.
	e.call("GET", "/v1/payments/pay_1", "acme", "")
	assert.Empty(t, seen)
}

// TestAnswerWaitsForItsRecord stores the outcome before the client may see
// it: when storing fails, the client gets 503 instead of an answer that
// its retry could never get back, and the retry does not run again.
func TestAnswerWaitsForItsRecord(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "4")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
		assert.NoError(t, e.db.Close()) // the store fails before the outcome is stored
	}
	resp, body := e.call("POST", "/v1/payments", "acme", pay, "held-1")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, idem.CodeStoreUnavailable, problem(t, resp, body).Code)
	assert.Equal(t, "held-1", resp.Header.Get("Idempotency-Key"))
	assert.NotEqual(t, "4", resp.Header.Get("Content-Length"), "nothing of the handler's answer leaks")
	assert.NotContains(t, body, "paid")
}

// TestAuthorizeReplay: the check runs before a replay only; a refusal
// sends nothing of the stored answer, and a check that fails sends it
// neither.
func TestAuthorizeReplay(t *testing.T) {
	var verdict atomic.Pointer[error]
	var checked atomic.Int32
	e := setup(t, idemhttp.Options{AuthorizeReplay: func(r *http.Request) error {
		checked.Add(1)
		if p := verdict.Load(); p != nil {
			return *p
		}
		return nil
	}})
	first, body := e.call("POST", "/v1/payments", "acme", pay, "key-1")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Zero(t, checked.Load(), "the first request is not a replay")

	again, replayed := e.call("POST", "/v1/payments", "acme", pay, "key-1")
	assert.Equal(t, http.StatusCreated, again.StatusCode)
	assert.Equal(t, body, replayed)
	assert.EqualValues(t, 1, checked.Load())

	for _, c := range []struct {
		err    error
		status int
		code   string
		retry  string
	}{
		{fmt.Errorf("token revoked: %w", idemhttp.ErrReplayForbidden), http.StatusForbidden, idem.CodeReplayForbidden, ""},
		{errors.New("dial tcp 10.0.0.7:443: connection refused"), http.StatusServiceUnavailable, idem.CodeReplayCheckFailed, "1"},
	} {
		verdict.Store(&c.err)
		res, got := e.call("POST", "/v1/payments", "acme", pay, "key-1")
		assert.Equal(t, c.status, res.StatusCode, c.code)
		assert.Contains(t, got, c.code)
		assert.NotContains(t, got, "pay_", "nothing of the stored answer")
		assert.NotContains(t, got, "10.0.0.7", "the check's error stays in the log")
		assert.Empty(t, res.Header.Get("Idempotent-Replayed"))
		assert.Empty(t, res.Header.Values("Set-Cookie"))
		assert.Equal(t, c.retry, res.Header.Get("Retry-After"), c.code)
	}
	assert.Equal(t, int64(1), e.app.runs.Load(), "a refused replay never runs the handler")
}

// TestReplayPolicy: under ReplayPublic an answer marked no-store or
// private keeps only its status, and its retry gets 410 with it and
// never the body; other answers replay whole. ReplayStatus keeps only
// the status of every answer. The handler never runs twice.
func TestReplayPolicy(t *testing.T) {
	for _, c := range []struct {
		policy       idemhttp.ReplayPolicy
		cacheControl string
		whole        bool
	}{
		{idemhttp.ReplayAll, "no-store", true},
		{idemhttp.ReplayPublic, "", true},
		{idemhttp.ReplayPublic, "max-age=60", true},
		{idemhttp.ReplayPublic, "no-cache, No-Store", false},
		{idemhttp.ReplayPublic, `private="Set-Cookie"`, false},
		{idemhttp.ReplayStatus, "", false},
	} {
		name := fmt.Sprint(c.policy, " ", c.cacheControl)
		e := setup(t, idemhttp.Options{Replay: c.policy})
		e.app.handler = func(w http.ResponseWriter, r *http.Request) {
			if c.cacheControl != "" {
				w.Header().Set("Cache-Control", c.cacheControl)
			}
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"secret":"sk_live_once"}`)
		}
		first, body := e.call("POST", "/v1/keys", "acme", pay, "key-1")
		require.Equal(t, http.StatusCreated, first.StatusCode, name)
		assert.Contains(t, body, "sk_live_once", "the first answer is whole: %s", name)
		again, replayed := e.call("POST", "/v1/keys", "acme", pay, "key-1")
		assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), name)
		if c.whole {
			assert.Equal(t, http.StatusCreated, again.StatusCode, name)
			assert.Equal(t, body, replayed, name)
		} else {
			assert.Equal(t, http.StatusGone, again.StatusCode, name)
			assert.Contains(t, replayed, `"original_status":201`, name)
			assert.NotContains(t, replayed, "sk_live_once", name)
			rec, err := e.db.Get(t.Context(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/keys", Key: "key-1"})
			require.NoError(t, err)
			assert.Empty(t, rec.Response.Body, "the body is never stored: %s", name)
			assert.NotContains(t, rec.Response.Header, "Cache-Control", name)
		}
		assert.EqualValues(t, 1, e.app.runs.Load(), name)
	}
	db, _ := idemtest.Open(t, nil)
	_, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: bearer, Replay: 7})
	assert.ErrorIs(t, err, idem.ErrInvalidOptions)
}

// Cookies and credential fields reach the first caller and are never
// stored, unless Options.Unstored says otherwise.
func TestUnstoredHeaders(t *testing.T) {
	for _, c := range []struct {
		unstored []string
		dropped  []string
		kept     []string
	}{
		{nil, []string{"Set-Cookie", "Www-Authenticate", "Authentication-Info"}, []string{"X-Charge"}},
		{[]string{}, nil, []string{"Set-Cookie", "Www-Authenticate", "X-Charge"}},
		{[]string{"x-charge"}, []string{"X-Charge"}, []string{"Set-Cookie"}},
	} {
		name := fmt.Sprint(c.unstored)
		e := setup(t, idemhttp.Options{Unstored: c.unstored})
		e.app.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Set-Cookie", "session=s3cr3t; HttpOnly")
			w.Header().Set("WWW-Authenticate", `Bearer realm="pay"`)
			w.Header().Set("Authentication-Info", `nextnonce="abc"`)
			w.Header().Set("X-Charge", "ch_1")
			w.WriteHeader(http.StatusCreated)
		}
		first, _ := e.call("POST", "/v1/payments", "acme", pay, "key-1")
		require.Equal(t, http.StatusCreated, first.StatusCode, name)
		assert.Equal(t, "session=s3cr3t; HttpOnly", first.Header.Get("Set-Cookie"), "the first caller gets every field: %s", name)
		again, _ := e.call("POST", "/v1/payments", "acme", pay, "key-1")
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), name)
		rec, err := e.db.Get(t.Context(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "key-1"})
		require.NoError(t, err)
		for _, f := range c.dropped {
			assert.Empty(t, again.Header.Values(f), "%s replayed: %s", f, name)
			assert.NotContains(t, rec.Response.Header, f, "%s stored: %s", f, name)
		}
		for _, f := range c.kept {
			assert.Equal(t, first.Header.Values(f), again.Header.Values(f), "%s: %s", f, name)
		}
	}
}

// TestStatusHeadersAndRegenerate: a status-only answer keeps the fields
// StatusHeaders names, minus the unstored ones, and its retry's 410 carries
// them; with Regenerate the retry gets the service's fresh answer instead,
// and the handler never runs twice.
func TestStatusHeadersAndRegenerate(t *testing.T) {
	handler := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/v1/exports/ex_1")
		w.Header().Set("Set-Cookie", "session=s3cr3t")
		w.Header().Set("X-Other", "no")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"url":"https://files.example/ex_1?sig=once"}`)
	}
	e := setup(t, idemhttp.Options{Replay: idemhttp.ReplayStatus, StatusHeaders: []string{"location", "Set-Cookie"}})
	e.app.handler = handler
	first, _ := e.call("POST", "/v1/exports", "acme", pay, "key-1")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	again, body := e.call("POST", "/v1/exports", "acme", pay, "key-1")
	assert.Equal(t, http.StatusGone, again.StatusCode)
	assert.Equal(t, "/v1/exports/ex_1", again.Header.Get("Location"))
	assert.Empty(t, again.Header.Get("Set-Cookie"), "an unstored field stays out")
	assert.Empty(t, again.Header.Get("X-Other"))
	assert.NotContains(t, body, "sig=once")
	rec, err := e.db.Get(t.Context(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/exports", Key: "key-1"})
	require.NoError(t, err)
	assert.Empty(t, rec.Response.Body)
	assert.Equal(t, []string{"/v1/exports/ex_1"}, rec.Response.Header["Location"])

	var seen *idem.Record
	e = setup(t, idemhttp.Options{Replay: idemhttp.ReplayStatus, StatusHeaders: []string{"Location"},
		Regenerate: func(r *http.Request, rec *idem.Record) (idem.Response, bool) {
			seen = rec
			if rec.Scope.Key != "key-1" {
				return idem.Response{}, false
			}
			return idem.Response{Status: rec.Response.Status, Header: http.Header{"Location": rec.Response.Header["Location"]},
				Body: []byte(`{"url":"https://files.example/ex_1?sig=fresh"}`)}, true
		}})
	e.app.handler = handler
	for _, key := range []string{"key-1", "key-2"} {
		first, _ = e.call("POST", "/v1/exports", "acme", pay, key)
		require.Equal(t, http.StatusCreated, first.StatusCode)
	}
	again, body = e.call("POST", "/v1/exports", "acme", pay, "key-1")
	assert.Equal(t, http.StatusCreated, again.StatusCode)
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "/v1/exports/ex_1", again.Header.Get("Location"))
	assert.Contains(t, body, "sig=fresh")
	require.NotNil(t, seen)
	assert.Equal(t, http.StatusCreated, seen.Response.Status)
	again, _ = e.call("POST", "/v1/exports", "acme", pay, "key-2")
	assert.Equal(t, http.StatusGone, again.StatusCode, "false sends the 410")
	assert.EqualValues(t, 2, e.app.runs.Load())
}
