package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/idemtest"
	memtest "github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/pebblestore"
	"github.com/idemkv/idem/pgstore"
)

func TestLookupURL(t *testing.T) {
	u, err := parseLookupURL("https://api.internal:8443/v1/lookups?v=2")
	require.NoError(t, err)
	assert.Equal(t, "/v1/lookups", u.Path)

	for _, bad := range []struct{ url, want string }{
		{"http://up/lookup/{key}", "the lookup's URL is fixed; the claim travels in the Idempotency-Key, Idempotency-Tenant and Idempotency-Endpoint headers"},
		{"http://up/lookup?tenant={tenant}", "the lookup's URL is fixed"},
		{"ftp://up/lookup", "must be an http:// or https:// URL"},
		{"/lookup", "must be an http:// or https:// URL"},
		{"http://user:pw@up/lookup", "no user or fragment"},
		{"http://up/lookup#frag", "no user or fragment"},
	} {
		_, err := parseLookupURL(bad.url)
		require.Error(t, err, bad.url)
		assert.Contains(t, err.Error(), bad.want, bad.url)
	}
}

// TestReservedPath: a client cannot reach the lookup's path through the
// proxy, however it spells it, and other paths pass; a lookup on another
// host reserves nothing.
func TestReservedPath(t *testing.T) {
	var reached []string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached = append(reached, r.URL.Path) })
	target, err := url.Parse("http://127.0.0.1:3000/api")
	require.NoError(t, err)
	lu, err := parseLookupURL("http://127.0.0.1:3000/api/internal/lookup")
	require.NoError(t, err)
	rc := newReconciler(lu, time.Second, 1, 0, slog.New(slog.DiscardHandler))
	h := refuseReserved(rc.reservedPath(target), target, idemhttp.DefaultProblemBase, next)
	for _, p := range []string{"/internal/lookup", "/internal/lookup/", "//internal/./lookup", "/Internal/LOOKUP", "/internal/x/../lookup", "/internal/lookup/abc"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "http://proxy"+p, nil))
		assert.Equal(t, http.StatusForbidden, w.Code, p)
		assert.Contains(t, w.Body.String(), codePathReserved, p)
	}
	for _, p := range []string{"/internal/lookups", "/internal", "/v1/charges"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "http://proxy"+p, nil))
		assert.Equal(t, http.StatusOK, w.Code, p)
	}
	assert.Equal(t, []string{"/internal/lookups", "/internal", "/v1/charges"}, reached)

	for _, other := range []string{"http://127.0.0.1:3001/api/internal/lookup", "https://127.0.0.1:3000/api/internal/lookup", "http://ledger.internal/api/internal/lookup"} {
		lu, err := parseLookupURL(other)
		require.NoError(t, err)
		assert.Empty(t, newReconciler(lu, time.Second, 1, 0, nil).reservedPath(target), other)
	}
	lu, err = parseLookupURL("http://127.0.0.1:80/lookup")
	require.NoError(t, err)
	plain, err := url.Parse("http://127.0.0.1")
	require.NoError(t, err)
	assert.Equal(t, "/lookup", newReconciler(lu, time.Second, 1, 0, nil).reservedPath(plain), "the default port is the same port")
}

func TestLookupHeader(t *testing.T) {
	h := http.Header{
		"Content-Type": {"application/json"}, "X-Request-Id": {"r1"}, "Set-Cookie": {"a=1", "b=2"},
		"Connection": {"keep-alive, X-Hop"}, "X-Hop": {"1"}, "Keep-Alive": {"timeout=5"}, "Date": {"Mon"}, "Content-Length": {"9"},
		"Idempotency-Key": {"k"}, "Idempotent-Replayed": {"true"}, "Idempotency-Outcome": {"store"}, "Idempotency-Original-Status": {"201"},
	}
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"r1"}, "Set-Cookie": {"a=1", "b=2"}}, lookupHeader(h))
}

// TestLookupUnstored: an answer found by a lookup is stored without the
// fields --unstored-headers names, as the upstream's own answer would be.
func TestLookupUnstored(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Set-Cookie", "session=s1")
		w.Header().Set("X-Trace", "t1")
		io.WriteString(w, "found")
	}))
	t.Cleanup(srv.Close)
	lu, err := parseLookupURL(srv.URL + "/lookup")
	require.NoError(t, err)
	rc := newReconciler(lu, 5*time.Second, 1<<20, 0, slog.New(slog.DiscardHandler))
	rc.unstored = []string{"set-cookie"}
	v, resp, err := rc.lookup(t.Context(), idem.Scope{Tenant: "t", Endpoint: "POST /x", Key: "k"})
	require.NoError(t, err)
	require.Equal(t, found, v)
	assert.Empty(t, resp.Header.Values("Set-Cookie"))
	assert.Equal(t, "t1", resp.Header.Get("X-Trace"))
	assert.Equal(t, "found", string(resp.Body))
}

// lookupToken is the token the tests' lookups carry.
const lookupToken = "lookup-token-0123456789"

// lookupUpstream is an upstream that serves POST /v1/charges, counting
// the runs of each key, and GET /lookup, which answers callers with
// lookupToken as the test set for the key in their Idempotency-Key.
type lookupUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	runs    map[string]int
	answers map[string]string // key -> found, absent, failing, unknown
	lookups []*http.Request
}

func newLookupUpstream(t *testing.T) *lookupUpstream {
	u := &lookupUpstream{runs: map[string]int{}, answers: map[string]string{}}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *lookupUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if r.URL.Path == "/v1/charges" {
		key := r.Header.Get("Idempotency-Key")
		u.runs[key]++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_run_%d"}`, u.runs[key])
		return
	}
	u.lookups = append(u.lookups, r.Clone(context.Background()))
	if r.Header.Get("Authorization") != "Bearer "+lookupToken {
		http.Error(w, "who are you", http.StatusUnauthorized)
		return
	}
	switch u.answers[r.Header.Get("Idempotency-Key")] {
	case "found":
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Charge", "ch_found")
		w.Header().Set(headerOriginalStatus, "201")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, `{"id":"ch_found"}`)
	case "absent":
		http.NotFound(w, r)
	case "unknown":
		w.Header().Set(idem.HeaderOutcome, "unknown")
		w.WriteHeader(http.StatusOK)
	default:
		http.Error(w, "the ledger is down", http.StatusServiceUnavailable)
	}
}

func (u *lookupUpstream) count(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[key]
}

// reconcileEnv is a proxy in front of a lookupUpstream, in process and on a
// fake clock, with a reconciler that asks the upstream. crashed is the
// same proxy over a store whose leases record nothing: a request through
// it reaches the upstream and leaves its claim in progress, as a proxy
// killed before it stored the answer does.
type reconcileEnv struct {
	up             *lookupUpstream
	db             idem.Operator
	clock          *idemtest.Clock
	rc             *reconciler
	proxy, crashed *httptest.Server
}

// The stores the reconciler is tested on.
var reconcileStores = []struct {
	name string
	open func(t *testing.T, clock *idemtest.Clock, reconcile func(context.Context, idem.Lease) error, log *slog.Logger) idem.Operator
}{
	{"embedded", func(t *testing.T, clock *idemtest.Clock, reconcile func(context.Context, idem.Lease) error, log *slog.Logger) idem.Operator {
		// The loop's interval is what the store's refusals quote; the test
		// reconciles by hand long before the loop would.
		db, _ := memtest.Open(t, &pebblestore.Options{Now: clock.Now, Reconcile: reconcile, Logger: log, SweepInterval: idem.DefaultSweepInterval})
		return db
	}},
	{"postgres", func(t *testing.T, clock *idemtest.Clock, reconcile func(context.Context, idem.Lease) error, log *slog.Logger) idem.Operator {
		db, err := pgstore.Open(t.Context(), pgDSN(t), &pgstore.Options{Now: clock.Now, Reconcile: reconcile, Logger: log, Migrate: pgstore.MigrateApply})
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		return db
	}},
}

func newReconcileEnv(t *testing.T, open func(*testing.T, *idemtest.Clock, func(context.Context, idem.Lease) error, *slog.Logger) idem.Operator, log *slog.Logger) *reconcileEnv {
	t.Helper()
	e := &reconcileEnv{up: newLookupUpstream(t), clock: idemtest.NewClock()}
	lu, err := parseLookupURL(e.up.URL + "/lookup")
	require.NoError(t, err)
	e.rc = newReconciler(lu, 5*time.Second, 1<<20, defaultReconcileAttempts, log)
	e.rc.token = lookupToken
	e.db = open(t, e.clock, e.rc.Reconcile, log)

	target, err := url.Parse(e.up.URL)
	require.NoError(t, err)
	tenant, err := parseTenantFrom("auth")
	require.NoError(t, err)
	forward := newProxyHandler(target, 5*time.Second, idemhttp.DefaultProblemBase, log)
	serve := func(store idem.Store) *httptest.Server {
		mw, err := idemhttp.New(idemhttp.Options{Store: store, Tenant: tenant.tenant, Logger: log})
		require.NoError(t, err)
		srv := httptest.NewServer(mw(forward))
		t.Cleanup(srv.Close)
		return srv
	}
	e.proxy, e.crashed = serve(e.db), serve(idemtest.Forgetful(e.db))
	return e
}

func (e *reconcileEnv) charge(t *testing.T, srv *httptest.Server, key string) reply {
	t.Helper()
	return send(t, "POST", srv.URL+"/v1/charges", `{"amount": 100}`, keyed(key)...)
}

func (e *reconcileEnv) scope(key string) idem.Scope {
	sum := sha256.Sum256([]byte(auth))
	return idem.Scope{Tenant: hex.EncodeToString(sum[:]), Endpoint: "POST /v1/charges", Key: key}
}

// TestReconcileFromLookup: claims left in progress by a crashed proxy are
// settled as the upstream's lookup says. Found: the retry gets the
// lookup's answer and nothing runs again. Not found: the retry runs.
// Unknown: the retry is refused until an operator resolves it. No answer:
// the claim stays in progress, and after --reconcile-attempts lookups its
// outcome is recorded unknown.
func TestReconcileFromLookup(t *testing.T) {
	for _, st := range reconcileStores {
		t.Run(st.name, func(t *testing.T) {
			var logged syncBuffer
			e := newReconcileEnv(t, st.open, slog.New(slog.NewTextHandler(&logged, nil)))
			ctx := t.Context()
			keys := map[string]string{}
			for _, answer := range []string{"found", "absent", "unknown", "failing"} {
				key := newKey()
				keys[answer] = key
				e.up.answers[key] = answer
				r := e.charge(t, e.crashed, key)
				require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
				require.Equal(t, 1, e.up.count(key))
			}

			res, err := e.db.Reconcile(ctx)
			require.NoError(t, err)
			assert.Equal(t, idem.ReconcileResult{}, res, "a live lease is left alone")

			e.clock.Advance(31 * time.Second) // past the 30 s lease
			r := e.charge(t, e.proxy, keys["found"])
			assert.Equal(t, http.StatusConflict, r.status)
			assert.Equal(t, idem.CodeInProgress, r.code(t), "the outcome is being looked up: retrying is worth it")
			assert.Equal(t, "60", r.header.Get("Retry-After"))

			res, err = e.db.Reconcile(ctx)
			require.NoError(t, err)
			assert.Equal(t, idem.ReconcileResult{Overdue: 4, Resolved: 3}, res)

			r = e.charge(t, e.proxy, keys["found"])
			assert.Equal(t, http.StatusCreated, r.status, "the original status, from "+headerOriginalStatus)
			assert.Equal(t, `{"id":"ch_found"}`, string(r.body))
			assert.Equal(t, "application/json", r.header.Get("Content-Type"))
			assert.Equal(t, "ch_found", r.header.Get("X-Charge"))
			assert.Empty(t, r.header.Get(headerOriginalStatus))
			assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
			assert.Equal(t, 1, e.up.count(keys["found"]), "a found operation never runs again")

			r = e.charge(t, e.proxy, keys["absent"])
			assert.Equal(t, http.StatusCreated, r.status)
			assert.Equal(t, `{"id":"ch_run_2"}`, string(r.body))
			assert.Empty(t, r.header.Get("Idempotent-Replayed"))
			assert.Equal(t, 2, e.up.count(keys["absent"]), "an operation that never took effect runs on retry")

			r = e.charge(t, e.proxy, keys["unknown"])
			assert.Equal(t, http.StatusConflict, r.status)
			assert.Equal(t, idem.CodeOutcomePending, r.code(t))
			assert.Equal(t, 1, e.up.count(keys["unknown"]))

			// No answer: still in progress, under the reconciler's lease.
			rec, err := e.db.Get(ctx, e.scope(keys["failing"]))
			require.NoError(t, err)
			assert.Equal(t, idem.StateInProgress, rec.State)
			assert.Equal(t, uint32(2), rec.Attempts)
			r = e.charge(t, e.proxy, keys["failing"])
			assert.Equal(t, http.StatusConflict, r.status)
			assert.Equal(t, idem.CodeInProgress, r.code(t))
			assert.Equal(t, 1, e.up.count(keys["failing"]), "an unanswered lookup never runs the operation")

			// What the lookup was asked.
			e.up.mu.Lock()
			var asked *http.Request
			for _, l := range e.up.lookups {
				if l.Header.Get("Idempotency-Key") == keys["failing"] {
					asked = l
				}
			}
			e.up.mu.Unlock()
			require.NotNil(t, asked)
			assert.Equal(t, "GET", asked.Method)
			assert.Equal(t, "/lookup", asked.URL.RequestURI(), "nothing of the claim is in the URL")
			assert.Equal(t, e.scope("").Tenant, asked.Header.Get(headerLookupTenant))
			assert.Equal(t, "POST /v1/charges", asked.Header.Get(headerLookupEndpoint))
			assert.Equal(t, lookupUserAgent, asked.Header.Get("User-Agent"))

			// The bound: the second unanswered lookup records it unknown.
			e.rc.attempts = 2
			e.clock.Advance(31 * time.Second)
			res, err = e.db.Reconcile(ctx)
			require.NoError(t, err)
			assert.Equal(t, idem.ReconcileResult{Overdue: 1, Resolved: 1}, res)
			rec, err = e.db.Get(ctx, e.scope(keys["failing"]))
			require.NoError(t, err)
			assert.Equal(t, idem.StateUnknown, rec.State)
			r = e.charge(t, e.proxy, keys["failing"])
			assert.Equal(t, idem.CodeOutcomePending, r.code(t))
			assert.Equal(t, 1, e.up.count(keys["failing"]))

			out := logged.String()
			assert.Contains(t, out, "503 Service Unavailable, neither 2xx (found) nor 404 (not found)")
			assert.Contains(t, out, "went unanswered too often")
			for _, key := range keys {
				assert.NotContains(t, out, key, "a key reached the log")
			}
		})
	}
}

// TestReconcileUnreachable: a lookup that cannot reach the upstream
// leaves the claim in progress, and the log says why without the URL,
// whose query may hold a secret.
func TestReconcileUnreachable(t *testing.T) {
	var logged syncBuffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	lu, err := parseLookupURL(closed.URL + "/lookup/by-key?secret=s3")
	require.NoError(t, err)
	rc := newReconciler(lu, 5*time.Second, 1<<20, defaultReconcileAttempts, log)
	clock := idemtest.NewClock()
	db, _ := memtest.Open(t, &pebblestore.Options{Now: clock.Now, Reconcile: rc.Reconcile, Logger: log})

	s := idem.Scope{Tenant: "acme", Endpoint: "POST /v1/charges", Key: newKey()}
	_, _, err = db.Claim(t.Context(), s, idem.Fingerprint{1})
	require.NoError(t, err)
	clock.Advance(time.Hour)
	res, err := db.Reconcile(t.Context())
	require.NoError(t, err)
	assert.Equal(t, idem.ReconcileResult{Overdue: 1}, res)
	rec, err := db.Get(t.Context(), s)
	require.NoError(t, err)
	assert.Equal(t, idem.StateInProgress, rec.State, "a transient failure never settles the claim")
	assert.Contains(t, logged.String(), "connection refused")
	assert.NotContains(t, logged.String(), s.Key)
	assert.False(t, strings.Contains(logged.String(), "/lookup/"), "the lookup's URL reached the log")
	assert.NotContains(t, logged.String(), "s3")
}

// TestReconcileFlags: a --reconcile-url or --reconcile-attempts that
// cannot work stops the proxy before it starts, and --help explains both.
func TestReconcileFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--reconcile-url", "http://up/lookup/{id}"}, "--reconcile-url: \"http://up/lookup/{id}\": the lookup's URL is fixed"},
		{[]string{"--reconcile-url", "up/lookup"}, "must be an http:// or https:// URL"},
		{[]string{"--reconcile-url", "http://up/lookup", "--reconcile-attempts", "-1"}, "--reconcile-attempts -1 must not be negative"},
		{[]string{"--reconcile-url", "http://up/lookup", "--reconcile-token-file", "/nonexistent/token"}, "--reconcile-token-file: open"},
	} {
		r := runIdem(t, "", append([]string{"proxy", "--upstream", "http://127.0.0.1:1", "--data", t.TempDir()}, c.args...)...)
		assert.Equal(t, 2, r.code, c.args)
		assert.Contains(t, r.stderr, c.want, c.args)
	}
	r := runIdem(t, "", "proxy", "--help")
	assert.Equal(t, 0, r.code)
	for _, want := range []string{"-reconcile-url URL", "-reconcile-attempts", "-reconcile-token-file", headerLookupTenant, headerOriginalStatus, docsURL("docs/proxy.md#reconciling-with-the-upstream")} {
		assert.Contains(t, r.stderr, want)
	}
}
