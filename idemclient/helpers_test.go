package idemclient_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemclient"
	fake "github.com/idemkv/idem/idemtest"
)

// fakeClock stands in for the Transport's timer (SetSleep) beside the Now
// of the repository's fake clock, which it embeds: a sleep returns at once
// after moving the clock forward, so no test really waits.
type fakeClock struct {
	*fake.Clock
	mu      sync.Mutex
	waits   []time.Duration // guarded by mu, with the clock's moves
	onSleep func(n int)     // called with the sleep's number (1 for the first)
}

func newFakeClock() *fakeClock { return &fakeClock{Clock: fake.NewClock()} }

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.Advance(d)
	n, hook := len(c.waits), c.onSleep
	c.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	return nil
}

func (c *fakeClock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

// step is one scripted answer of a flaky server.
type step struct {
	status int
	header http.Header
	body   string
	drop   bool // read the request, then close the connection unanswered
	stall  bool // never answer; wait for the client to give up
}

func status(code int) step { return step{status: code} }

func withRetryAfter(code int, v string) step {
	return step{status: code, header: http.Header{"Retry-After": {v}}}
}

// problemStep is an RFC 9457 answer carrying one of idem's problem codes.
func problemStep(code int, problem string, retryAfter string) step {
	h := http.Header{"Content-Type": {"application/problem+json"}}
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	return step{status: code, header: h, body: `{"type":"about:blank","status":` + strconv.Itoa(code) + `,"code":"` + problem + `"}`}
}

// seen is what a flaky server received on one request.
type seen struct {
	header http.Header
	body   string
}

// flaky is an httptest server that answers with its script in order, then
// with 201 to everything.
type flaky struct {
	mu    sync.Mutex
	steps []step
	got   []seen
	conns atomic.Int32 // connections opened to it
	srv   *httptest.Server
}

func newFlaky(t *testing.T, steps ...step) *flaky {
	t.Helper()
	f := &flaky{steps: steps}
	f.srv = httptest.NewUnstartedServer(f)
	f.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.conns.Add(1)
		}
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	n := len(f.got)
	f.got = append(f.got, seen{header: r.Header.Clone(), body: string(body)})
	st := step{status: http.StatusCreated, body: `{"id":"ord_1"}`}
	if n < len(f.steps) {
		st = f.steps[n]
	}
	f.mu.Unlock()
	switch {
	case st.drop:
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	case st.stall:
		<-r.Context().Done()
		return
	}
	for k, vs := range st.header {
		w.Header()[k] = vs
	}
	w.WriteHeader(st.status)
	io.WriteString(w, st.body)
}

// requests returns what the server has received so far.
func (f *flaky) requests() []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seen(nil), f.got...)
}

// keys returns the Idempotency-Key of every request received.
func (f *flaky) keys() []string {
	var ks []string
	for _, s := range f.requests() {
		ks = append(ks, s.header.Get(idem.HeaderKey))
	}
	return ks
}

// noReuse is a base transport that opens a connection per attempt. Tests
// that count attempts on the server use it because net/http itself resends
// a request carrying an Idempotency-Key when a reused connection breaks,
// which would add attempts the Transport never made.
func noReuse() *http.Transport { return &http.Transport{DisableKeepAlives: true} }

func newTransport(t *testing.T, o *idemclient.Options) *idemclient.Transport {
	t.Helper()
	tr, err := idemclient.NewTransport(o)
	require.NoError(t, err)
	return tr
}

// request builds a request whose body can be sent again, as
// http.NewRequest makes one from a string.
func request(t *testing.T, ctx context.Context, method, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	require.NoError(t, err)
	return req
}

// post is a request POSTing a JSON body.
func post(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req := request(t, ctx, http.MethodPost, url, body)
	req.Header.Set("Content-Type", "application/json")
	return req
}

// sleeping makes the Transport built from o sleep on c, and returns o.
func sleeping(c *fakeClock, o *idemclient.Options) *idemclient.Options {
	idemclient.SetSleep(o, c.Sleep)
	return o
}
