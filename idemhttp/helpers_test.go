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

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/internal/idemtest"
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

const pay = `{"amount":4200,"currency":"usd","customer":"cus_1"}`
