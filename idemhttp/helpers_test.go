package idemhttp_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/pebblestore"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

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
	w.Header().Add("Link", "</v1/payments>; rel=collection")
	w.Header().Add("Link", "</docs/payments>; rel=help")
	w.Header().Set("Connection", "close-me-not") // hop-by-hop: never stored
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"pay_%d","request":%s}`, n, body)
}

// env is the payments app served behind the middleware.
type env struct {
	t   *testing.T
	db  *pebblestore.Store // the store, if it is a DB
	app *app
	srv *httptest.Server
}

// setup serves app behind the middleware built from o, which gets an
// in-memory DB, the bearer tenant and a silent logger unless it sets its
// own. The middleware wraps each of three routes, POST /v1/payments,
// POST /v1/refunds and GET /v1/payments/{id}, so that they name the
// endpoint; a request no route matches reaches it with no pattern, as
// when it wraps a whole handler tree. outer are layers around all of it,
// the first outermost, as a service's own middleware would be.
func setup(t *testing.T, o idemhttp.Options, outer ...func(http.Handler) http.Handler) *env {
	t.Helper()
	if o.Store == nil {
		o.Store, _ = idemtest.Open(t, nil)
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
	unrouted := mw(a)
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern == "" {
			unrouted.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
	for i := len(outer) - 1; i >= 0; i-- {
		h = outer[i](h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	db, _ := o.Store.(*pebblestore.Store)
	return &env{t: t, db: db, app: a, srv: srv}
}

// useHTTP2 moves e to a TLS server that speaks HTTP/2, with the same
// handler.
func (e *env) useHTTP2() {
	srv := httptest.NewUnstartedServer(e.srv.Config.Handler)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	e.t.Cleanup(srv.Close)
	e.srv.Close()
	e.srv = srv
}

// request builds the request that callWith sends: a JSON body with the
// extra headers, the tenant's bearer token unless tenant is empty, and one
// Idempotency-Key field line per key (none: no header).
func (e *env) request(extra http.Header, method, path, tenant, body string, keys ...string) *http.Request {
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
	return req
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
	resp, err := e.srv.Client().Do(e.request(extra, method, path, tenant, body, keys...))
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp, string(b)
}

// serve runs req through the server's handler on the calling goroutine,
// with no server around it, so that a panic or a runtime.Goexit in the
// handler reaches the caller.
func (e *env) serve(req *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	e.srv.Config.Handler.ServeHTTP(w, req)
	return w
}

const pay = `{"amount":4200,"currency":"usd","customer":"cus_1"}`
