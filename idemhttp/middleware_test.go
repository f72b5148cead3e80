package idemhttp_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/contract"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/internal/idemtest"
)

// bearer is the test's authentication: the tenant is the bearer token.
func bearer(r *http.Request) (string, error) {
	t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || t == "" {
		return "", errors.New("no bearer token")
	}
	return t, nil
}

// app is a payments endpoint that counts its executions.
type app struct {
	runs    atomic.Int64
	handler http.HandlerFunc // optional override
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.runs.Add(1)
	if a.handler != nil {
		a.handler(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Run", fmt.Sprint(n))
	w.Header().Add("Set-Cookie", "a=1")
	w.Header().Add("Set-Cookie", "b=2")
	w.Header().Set("Connection", "close-me-not") // hop-by-hop: never stored
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"pay_%d","request":%s}`, n, body)
}

type env struct {
	t   *testing.T
	db  *idem.DB
	app *app
	srv *httptest.Server
}

func setup(t *testing.T, o idemhttp.Options) *env {
	t.Helper()
	db, _ := idemtest.Open(t, nil)
	if o.Store == nil {
		o.Store = db
	}
	if o.Tenant == nil {
		o.Tenant = bearer
	}
	if o.Logger == nil {
		o.Logger = discardLogger()
	}
	mw, err := idemhttp.New(o)
	require.NoError(t, err)
	a := &app{}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw(a))
	mux.Handle("POST /v1/refunds", mw(a))
	mux.Handle("GET /v1/payments/{id}", mw(a))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &env{t: t, db: db, app: a, srv: srv}
}

// call sends a request with the given key header values (none: no
// header) and returns the response with its body read.
func (e *env) call(method, path, tenant, body string, keys ...string) (*http.Response, string) {
	e.t.Helper()
	return e.callWith(nil, method, path, tenant, body, keys...)
}

// callWith is call with extra request headers.
func (e *env) callWith(extra http.Header, method, path, tenant, body string, keys ...string) (*http.Response, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	require.NoError(e.t, err)
	req.Header.Set("Content-Type", "application/json")
	maps.Copy(req.Header, extra)
	if tenant != "" {
		req.Header.Set("Authorization", "Bearer "+tenant)
	}
	for _, k := range keys {
		req.Header.Add("Idempotency-Key", k)
	}
	resp, err := e.srv.Client().Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp, string(b)
}

func problem(t *testing.T, resp *http.Response, body string) idemhttp.Problem {
	t.Helper()
	assert.Equal(t, idemhttp.ProblemType, resp.Header.Get("Content-Type"))
	var p idemhttp.Problem
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	assert.Equal(t, resp.StatusCode, p.Status)
	return p
}

const pay = `{"amount":4200,"currency":"usd","customer":"cus_1"}`

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
	assert.Equal(t, first.Header.Values("Set-Cookie"), again.Header.Values("Set-Cookie"))
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
	assert.Equal(t, contract.CodeKeyReuse, problem(t, resp, body).Code)
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
	assert.Equal(t, contract.CodeKeyReuse, problem(t, resp, body).Code)
}

func TestBadKeysAreRefusedAndStoreNothing(t *testing.T) {
	e := setup(t, idemhttp.Options{Aliases: []string{"X-Idempotency-Key"}})
	tests := []struct {
		name string
		keys []string
		code string
	}{
		{"missing", nil, contract.CodeKeyMissing},
		{"empty", []string{""}, contract.CodeKeyInvalid},
		{"blank", []string{"   "}, contract.CodeKeyInvalid},
		{"256 characters", []string{strings.Repeat("a", 256)}, contract.CodeKeyInvalid},
		{"bad alphabet", []string{"key with spaces"}, contract.CodeKeyInvalid},
		{"dot", []string{"a.b"}, contract.CodeKeyInvalid},
		{"non-ASCII", []string{"clé"}, contract.CodeKeyInvalid},
		{"two field lines", []string{"a", "b"}, contract.CodeKeyInvalid},
		{"a list", []string{"a, b"}, contract.CodeKeyInvalid},
		{"broken sf-string", []string{`"abc`}, contract.CodeKeyInvalid},
		{"sf-string with a bad escape", []string{`"a\b"`}, contract.CodeKeyInvalid},
		{"empty sf-string", []string{`""`}, contract.CodeKeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := e.call("POST", "/v1/payments", "acme", pay, tt.keys...)
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
			assert.Equal(t, tt.code, problem(t, resp, body).Code)
		})
	}
	t.Run("standard name and alias together", func(t *testing.T) {
		req, _ := http.NewRequest("POST", e.srv.URL+"/v1/payments", strings.NewReader(pay))
		req.Header.Set("Authorization", "Bearer acme")
		req.Header.Set("Idempotency-Key", "a")
		req.Header.Set("X-Idempotency-Key", "a")
		resp, err := e.srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})
	assert.Zero(t, e.app.runs.Load())
	m, err := e.db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Zero(t, m.Claims, "nothing was claimed")

	// The limits are inclusive, and both forms of the header work.
	for _, k := range []string{strings.Repeat("a", 255), `"quoted-key_1"`, "A-z_0"} {
		resp, _ := e.call("POST", "/v1/payments", "acme", pay, k)
		assert.Equal(t, http.StatusCreated, resp.StatusCode, k)
	}
	resp, _ := e.call("POST", "/v1/payments", "acme", pay, "quoted-key_1")
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "an sf-string names the same key as the bare token")
}

func TestAliasHeader(t *testing.T) {
	e := setup(t, idemhttp.Options{Aliases: []string{"X-Idempotency-Key"}})
	for range 2 {
		req, _ := http.NewRequest("POST", e.srv.URL+"/v1/payments", strings.NewReader(pay))
		req.Header.Set("Authorization", "Bearer acme")
		req.Header.Set("X-Idempotency-Key", "via-alias")
		resp, err := e.srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	assert.Equal(t, int64(1), e.app.runs.Load())
}

func TestOtherRefusals(t *testing.T) {
	e := setup(t, idemhttp.Options{MaxRequestBytes: 64})
	resp, body := e.call("POST", "/v1/payments", "", pay, "k")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Equal(t, contract.CodeTenantMissing, problem(t, resp, body).Code)

	resp, body = e.call("POST", "/v1/payments", strings.Repeat("t", idem.MaxTenantBytes+1), pay, "k")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	p := problem(t, resp, body)
	assert.Equal(t, contract.CodeTenantMissing, p.Code, "a tenant too long to store is the credential's fault, not the key's")
	assert.Contains(t, p.Detail, "more than 255")
	assert.Zero(t, e.app.runs.Load())

	resp, body = e.call("POST", "/v1/payments", "acme", `{"amount":`+strings.Repeat("1", 100)+`}`, "k")
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	assert.Equal(t, contract.CodePayloadTooLarge, problem(t, resp, body).Code)

	resp, body = e.call("POST", "/v1/payments", "acme", `{"a":1,"a":2}`, "k")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	p = problem(t, resp, body)
	assert.Equal(t, contract.CodeBodyInvalid, p.Code)
	assert.Equal(t, "duplicate_member", p.BodyError)
	require.NotNil(t, p.BodyOffset)

	assert.Zero(t, e.app.runs.Load())
	m, err := e.db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Zero(t, m.Claims)
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
	db, _ := idemtest.Open(t, nil)
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: bearer, Logger: discardLogger()})
	require.NoError(t, err)
	a := &app{}
	capped := mw(a)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/capped" {
			r.Body = http.MaxBytesReader(w, r.Body, 10)
		}
		capped.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e := &env{t: t, db: db, app: a, srv: srv}

	resp, body := e.call("POST", "/v1/"+strings.Repeat("a", idem.MaxEndpointBytes), "acme", pay, "k")
	assert.Equal(t, http.StatusRequestURITooLong, resp.StatusCode)
	p := problem(t, resp, body)
	assert.Equal(t, contract.CodeURITooLong, p.Code)
	assert.Contains(t, p.Detail, "more than 1024")

	resp, body = e.call("POST", "/capped", "acme", pay, "k")
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	p = problem(t, resp, body)
	assert.Equal(t, contract.CodePayloadTooLarge, p.Code)
	assert.Contains(t, p.Detail, "larger than 10 bytes")

	assert.Zero(t, a.runs.Load())
	m, err := db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Zero(t, m.Claims)
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
	assert.Equal(t, contract.CodeOutcomePending, problem(t, resp, body).Code)
	assert.Equal(t, int64(3), e.app.runs.Load(), "an unknown outcome is never re-run")
}

func TestPanicRecordsUnknownAndPropagates(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	var seen []idemhttp.Observation
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: bearer, Logger: discardLogger(),
		Observe: func(o idemhttp.Observation) { seen = append(seen, o) }})
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { panic("boom") }))
	req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(pay))
	req.Header.Set("Authorization", "Bearer acme")
	req.Header.Set("Idempotency-Key", "p")
	assert.PanicsWithValue(t, "boom", func() { h.ServeHTTP(httptest.NewRecorder(), req) })
	rec, err := db.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "p"})
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State)
	require.Len(t, seen, 1, "a panicking request is still observed")
	assert.Equal(t, idemhttp.OutcomePanic, seen[0].Outcome)
	assert.Equal(t, http.StatusInternalServerError, seen[0].Status)
}

// TestReplayKeepsTheRetrysOwnHeaders: headers that layers around the
// middleware set for one request (its ID, the CORS answer for its origin,
// a session cookie) are not the stored response; a retry carries its own.
// What the handler set is replayed: a field it changed from the outer
// layer's value replaces the retry's, values it added go beside them.
func TestReplayKeepsTheRetrysOwnHeaders(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: bearer, Logger: discardLogger()})
	require.NoError(t, err)
	a := &app{}
	inner := mw(a)
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", fmt.Sprintf("req-%d", n.Add(1)))
		w.Header().Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Add("Set-Cookie", fmt.Sprintf("sid=s%d", n.Load()))
		w.Header().Set(http.TrailerPrefix+"X-Trace", fmt.Sprintf("t%d", n.Load()))
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	a.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "private")
		w.Header().Add("Set-Cookie", "receipt=pay_1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay_1"}`)
	}
	e := &env{t: t, db: db, app: a, srv: srv}
	post := func(origin string) *http.Response {
		resp, _ := e.callWith(http.Header{"Origin": {origin}}, "POST", "/v1/payments", "acme", pay, "rid")
		return resp
	}
	first := post("https://a.example")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Equal(t, "req-1", first.Header.Get("X-Request-Id"))

	again := post("https://b.example")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "req-2", again.Header.Get("X-Request-Id"))
	assert.Equal(t, "https://b.example", again.Header.Get("Access-Control-Allow-Origin"))
	assert.Equal(t, "private", again.Header.Get("Cache-Control"), "the handler's own value")
	assert.Equal(t, []string{"sid=s2", "receipt=pay_1"}, again.Header.Values("Set-Cookie"), "the retry's session, the handler's cookie")
	assert.Equal(t, "t2", again.Trailer.Get("X-Trace"), "the retry's own trailer")
	assert.Equal(t, "application/json", again.Header.Get("Content-Type"))
	assert.Equal(t, int64(1), a.runs.Load())
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
	assert.Equal(t, contract.CodeKeyReuse, problem(t, resp, body).Code)
	assert.Equal(t, int64(1), e.app.runs.Load())
}

// TestTrailersAreSentAndReplayed: trailers, declared before the status or
// named with http.TrailerPrefix, are set after the body; they reach the
// first client and are part of what a retry gets back.
func TestTrailersAreSentAndReplayed(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
		w.Header().Set("X-Checksum", "abc123")
		w.Header().Set(http.TrailerPrefix+"X-Late", "zz")
	}
	for i, want := range []string{"", "true"} {
		resp, body := e.call("POST", "/v1/payments", "acme", pay, "tr")
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, want, resp.Header.Get("Idempotent-Replayed"), "call %d", i)
		assert.Equal(t, "paid", body)
		assert.Equal(t, "abc123", resp.Trailer.Get("X-Checksum"), "call %d", i)
		assert.Equal(t, "zz", resp.Trailer.Get("X-Late"), "call %d", i)
		assert.Empty(t, resp.Header.Get("X-Checksum"), "a trailer is not a header")
	}
	assert.Equal(t, int64(1), e.app.runs.Load())
}

// TestWritesPastTheDeclaredLengthAreRefused: net/http refuses a write
// that would pass the Content-Length the handler declared, so the first
// client never gets it; neither does a retry.
func TestWritesPastTheDeclaredLengthAreRefused(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "4")
		w.WriteHeader(http.StatusCreated)
		_, err := io.WriteString(w, "paid")
		assert.NoError(t, err)
		_, err = io.WriteString(w, "!")
		assert.ErrorIs(t, err, http.ErrContentLength)
	}
	for range 2 {
		resp, body := e.call("POST", "/v1/payments", "acme", pay, "cl")
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, "paid", body)
	}
	assert.Equal(t, int64(1), e.app.runs.Load())
}

// TestReplayFramesTrailersAsTheFirstAnswer: the first answer and its
// replay carry the same trailers and the same framing, whether the
// trailers were set before the first flush, named only with the prefix on
// a short body (which net/http would otherwise send with a length and no
// trailers), or come with a declared length (then there are none).
func TestReplayFramesTrailersAsTheFirstAnswer(t *testing.T) {
	for name, h := range map[string]http.HandlerFunc{
		"set before the first flush": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Checksum")
			w.WriteHeader(http.StatusCreated)
			w.Header().Set("X-Checksum", "abc123")
			w.Header().Set(http.TrailerPrefix+"X-Early", "ee")
			io.WriteString(w, "pa")
			http.NewResponseController(w).Flush()
			io.WriteString(w, "id")
		},
		"undeclared, short body": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
			w.Header().Set(http.TrailerPrefix+"X-Sum", "zz")
		},
		"declared length": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "4")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
			w.Header().Set(http.TrailerPrefix+"X-Sum", "zz")
		},
		"declared length, trailer set before the status": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "4")
			w.Header().Set(http.TrailerPrefix+"X-Sum", "zz")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
		},
		"declared, never set": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Error")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := setup(t, idemhttp.Options{})
			e.app.handler = h
			first, body := e.call("POST", "/v1/payments", "acme", pay, "tf")
			require.Equal(t, http.StatusCreated, first.StatusCode)
			assert.Equal(t, "paid", body)
			again, body := e.call("POST", "/v1/payments", "acme", pay, "tf")
			require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
			assert.Equal(t, "paid", body)
			assert.Equal(t, first.Trailer, again.Trailer)
			assert.Equal(t, first.ContentLength, again.ContentLength)
			if !strings.HasPrefix(name, "declared length") {
				assert.NotEmpty(t, first.Trailer, "the handler's trailers reach the client")
			}
		})
	}
}

// TestReplayKeepsADeclaredLength: a length the handler declared frames
// the replay as it framed the first answer, also past net/http's buffer,
// where an undeclared one would be chunked. A body too large to store is
// replayed without it, since the body is not sent.
func TestReplayKeepsADeclaredLength(t *testing.T) {
	db, _ := idemtest.Open(t, &idem.Options{InlineBodyBytes: 4 << 10, MaxBodyBytes: 4 << 10})
	e := setup(t, idemhttp.Options{Store: db})
	size := 4 << 10
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("x", size))
	}
	first, body := e.call("POST", "/v1/payments", "acme", pay, "cl")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Len(t, body, size)
	again, body := e.call("POST", "/v1/payments", "acme", pay, "cl")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Len(t, body, size)
	assert.Equal(t, int64(size), first.ContentLength)
	assert.Equal(t, first.ContentLength, again.ContentLength)

	size++ // over MaxBodyBytes: stored without its body
	first, _ = e.call("POST", "/v1/payments", "acme", pay, "omitted")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	again, body = e.call("POST", "/v1/payments", "acme", pay, "omitted")
	require.Equal(t, "true", again.Header.Get("Idempotent-Body-Omitted"))
	assert.Empty(t, body)
	assert.Zero(t, again.ContentLength)
}

// TestHTTP2ReplaysTrailersBesideALength: HTTP/2 sends trailers whatever
// the length, so its replay does too.
func TestHTTP2ReplaysTrailersBesideALength(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: bearer, Logger: discardLogger()})
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "4")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
		w.Header().Set(http.TrailerPrefix+"X-Sum", "zz")
	})))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	e := &env{t: t, db: db, srv: srv}
	first, body := e.call("POST", "/v1/payments", "acme", pay, "h2")
	require.Equal(t, 2, first.ProtoMajor)
	assert.Equal(t, "paid", body)
	again, body := e.call("POST", "/v1/payments", "acme", pay, "h2")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "paid", body)
	assert.Equal(t, "zz", first.Trailer.Get("X-Sum"))
	assert.Equal(t, first.Trailer, again.Trailer)
}

// TestGoexitRecordsUnknown: a handler that ends its goroutine instead of
// returning (runtime.Goexit, as t.FailNow does) may have done anything, as
// after a panic, and recover sees no value.
func TestGoexitRecordsUnknown(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: bearer, Logger: discardLogger()})
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runtime.Goexit() }))
	req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(pay))
	req.Header.Set("Authorization", "Bearer acme")
	req.Header.Set("Idempotency-Key", "g")
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	<-done
	rec, err := db.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "g"})
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State)
}

// TestHijackedAnswerIsNotReplayed: a handler that takes the connection
// answers where the recorder cannot see, so there is no response to store.
// The record becomes unknown and a retry gets 409 outcome_pending, never a
// made-up empty 200 marked as a replay.
func TestHijackedAnswerIsNotReplayed(t *testing.T) {
	seen := make(chan idemhttp.Observation, 2)
	e := setup(t, idemhttp.Options{Observe: func(o idemhttp.Observation) { seen <- o }})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if !assert.NoError(t, err) {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 202 Accepted\r\nContent-Length: 7\r\nConnection: close\r\n\r\nqueued!")
		rw.Flush()
	}
	resp, body := e.call("POST", "/v1/payments", "acme", pay, "h")
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	assert.Equal(t, "queued!", body)
	// The client has its answer before the middleware stores the outcome.
	o := <-seen
	assert.Equal(t, idemhttp.OutcomeHijacked, o.Outcome)
	assert.Zero(t, o.Status)

	resp, body = e.call("POST", "/v1/payments", "acme", pay, "h")
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Equal(t, contract.CodeOutcomePending, problem(t, resp, body).Code)
	assert.Empty(t, resp.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(1), e.app.runs.Load())
}

func TestClientDisconnectDoesNotCancelTheHandler(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: bearer, Logger: discardLogger()})
	require.NoError(t, err)
	outer := make(chan context.Context, 1)
	started := make(chan struct{})
	gone := make(chan struct{})
	handlerErr := make(chan error, 1)
	inner := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-gone // the server has seen the client leave
		handlerErr <- r.Context().Err()
		io.WriteString(w, "charged")
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		outer <- r.Context()
		inner.ServeHTTP(w, r)
	}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/payments", strings.NewReader(pay))
	req.Header.Set("Authorization", "Bearer acme")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "gone")
	go func() {
		connCtx := <-outer
		// Leave only once the middleware has read the whole body: a client
		// that leaves mid-upload gets 400 and the handler never runs.
		<-started
		cancel()
		<-connCtx.Done()
		close(gone)
	}()
	_, err = srv.Client().Do(req)
	require.Error(t, err)
	require.NoError(t, <-handlerErr, "the handler's context must outlive the client")

	scope := idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "gone"}
	require.NoError(t, db.Wait(context.Background(), scope))
	rec, err := db.Get(context.Background(), scope)
	require.NoError(t, err)
	assert.Equal(t, idem.StateCompleted, rec.State)
	assert.Equal(t, "charged", string(rec.Response.Body), "the retry will find the whole result")
}

func TestStreamedResponseIsFlushedAndStored(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	next := make(chan struct{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part one\n")
		require.NoError(t, http.NewResponseController(w).Flush())
		<-next
		io.WriteString(w, "part two\n")
	}
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/payments", strings.NewReader(pay))
	req.Header.Set("Authorization", "Bearer acme")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "s")
	resp, err := e.srv.Client().Do(req)
	require.NoError(t, err)
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "part one\n", line, "the first part arrives before the handler finishes")
	close(next)
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "part two\n", string(rest))
	require.NoError(t, e.db.Wait(context.Background(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "s"}))
	_, body := e.call("POST", "/v1/payments", "acme", pay, "s")
	assert.Equal(t, "part one\npart two\n", body)
}

func TestStoreFailureIs503(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	require.NoError(t, e.db.Close())
	resp, body := e.call("POST", "/v1/payments", "acme", pay, "k")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, contract.CodeStoreUnavailable, problem(t, resp, body).Code)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	assert.Zero(t, e.app.runs.Load())
}

// TestRouteTTL: a route's TTL is the store's, set per endpoint as the
// middleware names it.
func TestRouteTTL(t *testing.T) {
	db, _ := idemtest.Open(t, &idem.Options{EndpointTTL: map[string]time.Duration{"POST /v1/refunds": time.Hour}})
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
		Wait: -1, MismatchStatus: 500,
		Canonical: idem.CanonicalOptions{Volatile: []string{"no-slash"}},
		Aliases:   []string{"X-Idempotency-Key", "idempotency-key"},
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `Options.Aliases: "idempotency-key" is the same header as "Idempotency-Key"`)
	assert.NotContains(t, err.Error(), "X-Idempotency-Key")
	for _, want := range []string{"Methods", "KeyAlphabet", "MaxKeyLength", "Wait", "MismatchStatus", "Canonical"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestKeyEchoedOnceEvenIfTheHandlerAddsIt(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	e.app.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Idempotency-Key", r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusCreated)
	}
	first, _ := e.call("POST", "/v1/payments", "acme", pay, "echo")
	again, _ := e.call("POST", "/v1/payments", "acme", pay, "echo")
	assert.Equal(t, []string{"echo"}, first.Header.Values("Idempotency-Key"))
	assert.Equal(t, []string{"echo"}, again.Header.Values("Idempotency-Key"))
}

func TestObserveReportsEachOutcome(t *testing.T) {
	seen := make(chan idemhttp.Observation, 8)
	e := setup(t, idemhttp.Options{Observe: func(o idemhttp.Observation) { seen <- o }})
	next := func() idemhttp.Observation {
		select {
		case o := <-seen:
			return o
		default:
			t.Fatal("the middleware answered without calling Observe first")
			return idemhttp.Observation{}
		}
	}
	steps := []struct {
		method, path, body, key string
		outcome                 string
		status                  int
	}{
		{"POST", "/v1/payments", pay, "obs-1", idemhttp.OutcomeExecuted, http.StatusCreated},
		{"POST", "/v1/payments", pay, "obs-1", idemhttp.OutcomeReplayed, http.StatusCreated},
		{"POST", "/v1/payments", `{"amount":1}`, "obs-1", contract.CodeKeyReuse, http.StatusUnprocessableEntity},
		{"POST", "/v1/refunds", pay, "", contract.CodeKeyMissing, http.StatusBadRequest},
		{"POST", "/v1/refunds", `{"a":`, "obs-2", contract.CodeBodyInvalid, http.StatusBadRequest},
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
	assert.Equal(t, contract.CodeStoreUnavailable, problem(t, resp, body).Code)
	assert.Equal(t, "held-1", resp.Header.Get("Idempotency-Key"))
	assert.NotEqual(t, "4", resp.Header.Get("Content-Length"), "nothing of the handler's answer leaks")
	assert.NotContains(t, body, "paid")
}

// TestStreamKeepsItsEndUntilStored lets a flushing handler stream, but the
// client gets the last byte only once the outcome is stored; if storing
// fails the connection breaks instead, so no client ever holds a complete
// answer that a retry cannot replay.
func TestStreamKeepsItsEndUntilStored(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("store fails=%v", fail), func(t *testing.T) {
			e := setup(t, idemhttp.Options{})
			proceed := make(chan struct{})
			e.app.handler = func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "4")
				io.WriteString(w, "paid")
				http.NewResponseController(w).Flush()
				<-proceed
				if fail {
					assert.NoError(t, e.db.Close())
				}
			}
			req, err := http.NewRequest("POST", e.srv.URL+"/v1/payments", strings.NewReader(pay))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer acme")
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "stream-1")
			resp, err := e.srv.Client().Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			head := make([]byte, 3)
			_, err = io.ReadFull(resp.Body, head)
			require.NoError(t, err, "the stream flows while the handler runs")
			assert.Equal(t, "pai", string(head))
			close(proceed)
			rest, err := io.ReadAll(resp.Body)
			if fail {
				assert.Error(t, err, "a stream whose outcome was not stored must not end cleanly")
				assert.Empty(t, rest)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "d", string(rest))
			again, body := e.call("POST", "/v1/payments", "acme", pay, "stream-1")
			assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
			assert.Equal(t, "paid", body)
		})
	}
}
