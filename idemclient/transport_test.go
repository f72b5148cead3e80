package idemclient_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemclient"
)

// TestClientTable walks every row of the reference's client retry table:
// what is retried, with which key, after how long, and whether the
// operation counts as done.
func TestClientTable(t *testing.T) {
	tests := []struct {
		name          string
		steps         []step
		refresh       bool
		headerTimeout time.Duration
		wantAttempts  int
		wantStatus    int
		wantDone      int           // status the key store records; 0: still open
		wantMinWait   time.Duration // Retry-After the first wait must honour
		wantRefreshes int
	}{
		{name: "2xx success", steps: []step{status(201)}, wantAttempts: 1, wantStatus: 201, wantDone: 201},
		{name: "network error", steps: []step{{drop: true}}, wantAttempts: 2, wantStatus: 201, wantDone: 201},
		{name: "timeout", steps: []step{{stall: true}}, headerTimeout: 100 * time.Millisecond, wantAttempts: 2, wantStatus: 201, wantDone: 201},
		{name: "408", steps: []step{withRetryAfter(408, "2")}, wantAttempts: 2, wantStatus: 201, wantDone: 201, wantMinWait: 2 * time.Second},
		{name: "425", steps: []step{withRetryAfter(425, "3")}, wantAttempts: 2, wantStatus: 201, wantDone: 201, wantMinWait: 3 * time.Second},
		{name: "429", steps: []step{withRetryAfter(429, "4")}, wantAttempts: 2, wantStatus: 201, wantDone: 201, wantMinWait: 4 * time.Second},
		{name: "500", steps: []step{status(500)}, wantAttempts: 2, wantStatus: 201, wantDone: 201},
		{name: "502", steps: []step{status(502)}, wantAttempts: 2, wantStatus: 201, wantDone: 201},
		{name: "503", steps: []step{status(503)}, wantAttempts: 2, wantStatus: 201, wantDone: 201},
		{name: "504", steps: []step{status(504)}, wantAttempts: 2, wantStatus: 201, wantDone: 201},
		{name: "several failures in a row", steps: []step{status(503), {drop: true}, status(502)}, wantAttempts: 4, wantStatus: 201, wantDone: 201},
		{name: "409 in progress", steps: []step{problemStep(409, idem.CodeInProgress, "1")}, wantAttempts: 2, wantStatus: 201, wantDone: 201, wantMinWait: time.Second},
		{name: "409 outcome pending", steps: []step{problemStep(409, idem.CodeOutcomePending, "")}, wantAttempts: 1, wantStatus: 409},
		{name: "409 without a problem code", steps: []step{status(409)}, wantAttempts: 1, wantStatus: 409},
		{name: "422 fingerprint mismatch", steps: []step{problemStep(422, idem.CodeKeyReuse, "")}, wantAttempts: 1, wantStatus: 422, wantDone: 422},
		{name: "400 malformed", steps: []step{status(400)}, wantAttempts: 1, wantStatus: 400, wantDone: 400},
		{name: "401 with refresh", steps: []step{status(401)}, refresh: true, wantAttempts: 2, wantStatus: 201, wantDone: 201, wantRefreshes: 1},
		{name: "401 twice refreshes once", steps: []step{status(401), status(401)}, refresh: true, wantAttempts: 2, wantStatus: 401, wantRefreshes: 1},
		{name: "401 without refresh", steps: []step{status(401)}, wantAttempts: 1, wantStatus: 401},
		{name: "403", steps: []step{status(403)}, refresh: true, wantAttempts: 1, wantStatus: 403},
		{name: "404", steps: []step{status(404)}, wantAttempts: 1, wantStatus: 404, wantDone: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFlaky(t, tt.steps...)
			clock := newFakeClock()
			store := &idemclient.MemoryKeyStore{}
			base := noReuse()
			base.ResponseHeaderTimeout = tt.headerTimeout
			var refreshes atomic.Int32
			o := sleeping(clock, &idemclient.Options{
				Base:     base,
				KeyStore: store,
				Backoff:  idemclient.FullJitter(time.Second, 10*time.Second, rand.NewPCG(1, 2)),
				Now:      clock.Now,
			})
			if tt.refresh {
				o.Refresh = func(_ context.Context, req *http.Request) error {
					refreshes.Add(1)
					req.Header.Set("Authorization", "Bearer fresh")
					return nil
				}
			}
			tr := newTransport(t, o)
			ctx := idemclient.WithOperation(context.Background(), "op-"+tt.name)
			req := post(t, ctx, f.srv.URL+"/orders", `{"sku":"tea"}`)
			req.Header.Set("Authorization", "Bearer stale")

			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			defer resp.Body.Close()

			assert.Equal(t, tt.wantStatus, resp.StatusCode)
			assert.Equal(t, tt.wantAttempts, idemclient.Attempts(resp))
			assert.Len(t, f.requests(), tt.wantAttempts)
			assert.Equal(t, int32(tt.wantRefreshes), refreshes.Load())

			// One key for the whole operation, on every attempt.
			keys := f.keys()
			require.NotEmpty(t, keys[0])
			for _, k := range keys {
				assert.Equal(t, keys[0], k)
			}
			assert.Equal(t, keys[0], idemclient.Key(resp))
			stored, done, err := store.Lookup(ctx, "op-"+tt.name)
			require.NoError(t, err)
			assert.Equal(t, keys[0], stored)
			assert.Equal(t, tt.wantDone, done)

			// Every attempt sends the same body.
			for _, s := range f.requests() {
				assert.Equal(t, `{"sku":"tea"}`, s.body)
			}
			if tt.wantRefreshes > 0 {
				assert.Equal(t, "Bearer stale", f.requests()[0].header.Get("Authorization"))
				assert.Equal(t, "Bearer fresh", f.requests()[1].header.Get("Authorization"))
			}

			// A refresh repeats at once; a retry waits once per retry.
			waits := clock.Waits()
			assert.Len(t, waits, tt.wantAttempts-1-tt.wantRefreshes)
			if tt.wantMinWait > 0 {
				require.NotEmpty(t, waits)
				assert.GreaterOrEqual(t, waits[0], tt.wantMinWait)
			}
		})
	}
}

// zeroBackoff makes the wait exactly what Retry-After asks.
func zeroBackoff(int, *http.Response) time.Duration { return 0 }

func TestTransportRetryAfterForms(t *testing.T) {
	clock := newFakeClock()
	date := clock.Now().Add(7 * time.Second).Format(http.TimeFormat)
	tests := []struct {
		name     string
		first    step
		backoff  idemclient.Backoff
		wantWait time.Duration
	}{
		{name: "delta seconds", first: withRetryAfter(503, "3"), backoff: zeroBackoff, wantWait: 3 * time.Second},
		{name: "HTTP-date", first: withRetryAfter(503, date), backoff: zeroBackoff, wantWait: 7 * time.Second},
		{name: "unreadable falls back to backoff", first: withRetryAfter(503, "later"),
			backoff: func(int, *http.Response) time.Duration { return 250 * time.Millisecond }, wantWait: 250 * time.Millisecond},
		{name: "longer backoff wins over a short Retry-After", first: withRetryAfter(429, "1"),
			backoff: func(int, *http.Response) time.Duration { return 5 * time.Second }, wantWait: 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFlaky(t, tt.first)
			c := newFakeClock()
			tr := newTransport(t, sleeping(c, &idemclient.Options{Base: noReuse(), Backoff: tt.backoff, Now: c.Now}))
			resp, err := tr.RoundTrip(post(t, context.Background(), f.srv.URL, `{}`))
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, []time.Duration{tt.wantWait}, c.Waits())
		})
	}
}

func TestRetryAfterBeyondCapGivesUp(t *testing.T) {
	f := newFlaky(t, withRetryAfter(429, "120"))
	c := newFakeClock()
	tr := newTransport(t, sleeping(c, &idemclient.Options{Base: noReuse(), MaxRetryAfter: 30 * time.Second, Now: c.Now}))
	_, err := tr.RoundTrip(post(t, context.Background(), f.srv.URL, `{}`))
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, 1, rerr.Attempts)
	assert.Equal(t, http.StatusTooManyRequests, rerr.LastStatus)
	assert.Empty(t, c.Waits())
	assert.Contains(t, err.Error(), "MaxRetryAfter")
}

func TestAttemptLimit(t *testing.T) {
	f := newFlaky(t, status(503), status(503), status(503), status(503))
	c := newFakeClock()
	tr := newTransport(t, sleeping(c, &idemclient.Options{Base: noReuse(), MaxAttempts: 3, Now: c.Now}))
	_, err := tr.RoundTrip(post(t, context.Background(), f.srv.URL, `{}`))
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, 3, rerr.Attempts)
	assert.Equal(t, http.StatusServiceUnavailable, rerr.LastStatus)
	assert.Equal(t, f.keys()[0], rerr.Key)
	assert.Len(t, f.requests(), 3)
	assert.Len(t, c.Waits(), 2)
	assert.Contains(t, err.Error(), "attempt limit")
	assert.NotContains(t, err.Error(), rerr.Key, "keys stay out of error strings")
}

func TestElapsedLimit(t *testing.T) {
	f := newFlaky(t, status(503), status(503), status(503), status(503), status(503))
	c := newFakeClock()
	tr := newTransport(t, sleeping(c, &idemclient.Options{
		Base:        noReuse(),
		MaxAttempts: 10,
		MaxElapsed:  25 * time.Second,
		Backoff:     func(int, *http.Response) time.Duration { return 10 * time.Second },
		Now:         c.Now,
	}))
	_, err := tr.RoundTrip(post(t, context.Background(), f.srv.URL, `{}`))
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	// Attempts at 0 s, 10 s and 20 s; a third wait would end at 30 s.
	assert.Equal(t, 3, rerr.Attempts)
	assert.Equal(t, []time.Duration{10 * time.Second, 10 * time.Second}, c.Waits())
	assert.Contains(t, err.Error(), "time limit")
}

// cancelOnRetry is a slog handler that cancels a context shortly after the
// Transport announces a retry, that is, once the real timer has
// started its hour-long wait.
type cancelOnRetry struct {
	cancel context.CancelFunc
	fired  atomic.Bool
}

func (h *cancelOnRetry) Enabled(context.Context, slog.Level) bool { return true }

func (h *cancelOnRetry) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "idemclient: retrying" && !h.fired.Swap(true) {
		time.AfterFunc(20*time.Millisecond, h.cancel)
	}
	return nil
}

func (h *cancelOnRetry) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *cancelOnRetry) WithGroup(string) slog.Handler { return h }

func TestContextCancelledDuringWait(t *testing.T) {
	f := newFlaky(t, status(503))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := newTransport(t, &idemclient.Options{
		Base:       noReuse(),
		Backoff:    func(int, *http.Response) time.Duration { return time.Hour },
		MaxElapsed: 2 * time.Hour,
		Logger:     slog.New(&cancelOnRetry{cancel: cancel}),
		// The timer is left as it is: the real one must give way.
	})
	start := time.Now()
	_, err := tr.RoundTrip(post(t, ctx, f.srv.URL, `{}`))
	require.ErrorIs(t, err, context.Canceled)
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, 1, rerr.Attempts)
	assert.Equal(t, http.StatusServiceUnavailable, rerr.LastStatus)
	assert.Less(t, time.Since(start), 10*time.Second)
	assert.Len(t, f.requests(), 1)
}

func TestBodyNotRewindable(t *testing.T) {
	f := newFlaky(t)
	body := &trackedBody{Reader: strings.NewReader(`{"sku":"tea"}`)}
	req := post(t, context.Background(), f.srv.URL, "")
	req.Body, req.GetBody, req.ContentLength = body, nil, -1
	tr := newTransport(t, &idemclient.Options{Base: noReuse()})
	_, err := tr.RoundTrip(req)
	require.ErrorIs(t, err, idemclient.ErrBodyNotRewindable)
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, 0, rerr.Attempts)
	assert.Empty(t, f.requests(), "nothing is sent that could not be retried")
	assert.True(t, body.closed.Load(), "RoundTrip closes the body even when it refuses")
}

type trackedBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return nil }

func TestGetBodyFailure(t *testing.T) {
	f := newFlaky(t, status(503))
	req := post(t, context.Background(), f.srv.URL, `{}`)
	boom := errors.New("spool file gone")
	req.GetBody = func() (io.ReadCloser, error) { return nil, boom }
	c := newFakeClock()
	tr := newTransport(t, sleeping(c, &idemclient.Options{Base: noReuse(), Now: c.Now}))
	_, err := tr.RoundTrip(req)
	require.ErrorIs(t, err, boom)
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, 1, rerr.Attempts)
	assert.Len(t, f.requests(), 1)
}

// TestConnectionReuse checks that retried responses are drained, so that
// every attempt rides the first connection; with draining cut short, each
// attempt needs a new one.
func TestConnectionReuse(t *testing.T) {
	big := strings.Repeat("x", 16<<10)
	tests := []struct {
		name      string
		drain     int64
		wantConns int32
	}{
		{name: "drained", drain: 0, wantConns: 1},
		{name: "body beyond DrainBytes", drain: 16, wantConns: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFlaky(t, step{status: 503, body: big}, step{status: 502, body: big})
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			c := newFakeClock()
			tr := newTransport(t, sleeping(c, &idemclient.Options{Base: base, DrainBytes: tt.drain, Now: c.Now}))
			resp, err := tr.RoundTrip(post(t, context.Background(), f.srv.URL, `{}`))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, 3, idemclient.Attempts(resp))
			assert.Equal(t, tt.wantConns, f.conns.Load())
		})
	}
}

func TestKeyChoice(t *testing.T) {
	tests := []struct {
		name       string
		method     string
		header     string // Options.Header
		methods    []string
		callerKey  string
		wantHeader string // header the server should see the key in
		wantKey    string // "" means any non-empty generated key, "-" none
	}{
		{name: "POST gets a key", method: "POST", wantHeader: "Idempotency-Key"},
		{name: "caller's key is kept", method: "POST", callerKey: "caller-key-1", wantHeader: "Idempotency-Key", wantKey: "caller-key-1"},
		{name: "caller's key on another method is kept", method: "PATCH", callerKey: "caller-key-2", wantHeader: "Idempotency-Key", wantKey: "caller-key-2"},
		{name: "GET gets none", method: "GET", wantHeader: "Idempotency-Key", wantKey: "-"},
		{name: "PATCH gets none by default", method: "PATCH", wantHeader: "Idempotency-Key", wantKey: "-"},
		{name: "PATCH gets one when configured", method: "PATCH", methods: []string{"POST", "PATCH"}, wantHeader: "Idempotency-Key"},
		{name: "custom header", method: "POST", header: "X-Idempotency-Key", wantHeader: "X-Idempotency-Key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFlaky(t)
			tr := newTransport(t, &idemclient.Options{Base: noReuse(), Header: tt.header, Methods: tt.methods})
			req := request(t, context.Background(), tt.method, f.srv.URL, "")
			if tt.callerKey != "" {
				req.Header.Set(idem.HeaderKey, tt.callerKey)
			}
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
			got := f.requests()[0].header.Get(tt.wantHeader)
			switch tt.wantKey {
			case "":
				assert.NotEmpty(t, got)
			case "-":
				got = ""
				assert.Empty(t, f.requests()[0].header.Get(tt.wantHeader))
			default:
				assert.Equal(t, tt.wantKey, got)
			}
			assert.Equal(t, got, idemclient.Key(resp))
			if tt.callerKey == "" {
				assert.Empty(t, req.Header.Get(tt.wantHeader), "the caller's request is not modified")
			}
		})
	}
}

func TestCustomKeyGenerator(t *testing.T) {
	f := newFlaky(t, status(503))
	c := newFakeClock()
	var n atomic.Int32
	tr := newTransport(t, sleeping(c, &idemclient.Options{
		Base:   noReuse(),
		NewKey: func() (string, error) { n.Add(1); return "gen-key", nil }, Now: c.Now,
	}))
	resp, err := tr.RoundTrip(post(t, context.Background(), f.srv.URL, `{}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{"gen-key", "gen-key"}, f.keys())
	assert.Equal(t, int32(1), n.Load(), "one key per call, not per attempt")

	boom := errors.New("no entropy")
	tr = newTransport(t, &idemclient.Options{Base: noReuse(), NewKey: func() (string, error) { return "", boom }})
	_, err = tr.RoundTrip(post(t, context.Background(), f.srv.URL, `{}`))
	require.ErrorIs(t, err, boom)
	assert.Len(t, f.requests(), 2, "nothing sent without a key")
}

// TestUnkeyedRequests: without a key, only idempotent methods are retried.
func TestUnkeyedRequests(t *testing.T) {
	tests := []struct {
		method       string
		wantAttempts int
		wantStatus   int
	}{
		{method: "GET", wantAttempts: 2, wantStatus: 201},
		{method: "PUT", wantAttempts: 2, wantStatus: 201},
		{method: "DELETE", wantAttempts: 2, wantStatus: 201},
		{method: "PATCH", wantAttempts: 1, wantStatus: 503},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			f := newFlaky(t, status(503))
			c := newFakeClock()
			tr := newTransport(t, sleeping(c, &idemclient.Options{Base: noReuse(), Now: c.Now}))
			req := request(t, context.Background(), tt.method, f.srv.URL, "x")
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, tt.wantStatus, resp.StatusCode)
			assert.Len(t, f.requests(), tt.wantAttempts)
			assert.Empty(t, f.keys()[0])
		})
	}
}

func TestTransportErrorIsTheCause(t *testing.T) {
	f := newFlaky(t)
	url := f.srv.URL
	f.srv.Close() // nothing listens any more: every attempt is refused
	c := newFakeClock()
	tr := newTransport(t, sleeping(c, &idemclient.Options{Base: noReuse(), MaxAttempts: 3, Now: c.Now}))
	_, err := tr.RoundTrip(post(t, context.Background(), url, `{}`))
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, 3, rerr.Attempts)
	assert.Equal(t, 0, rerr.LastStatus)
	assert.NotEmpty(t, rerr.Key)
	var opErr *net.OpError
	assert.ErrorAs(t, err, &opErr, "unwraps to the network error")
}

func TestCheckRetryError(t *testing.T) {
	f := newFlaky(t, status(503))
	stop := errors.New("circuit open")
	tr := newTransport(t, &idemclient.Options{
		Base: noReuse(),
		CheckRetry: func(context.Context, *http.Response, error) (bool, error) {
			return false, stop
		},
	})
	_, err := tr.RoundTrip(post(t, context.Background(), f.srv.URL, `{}`))
	require.ErrorIs(t, err, stop)
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, 503, rerr.LastStatus)
}

// TestWrappedCheckRetry shows the intended way to change the policy: wrap
// the default rather than rewrite it.
func TestWrappedCheckRetry(t *testing.T) {
	f := newFlaky(t, status(409))
	c := newFakeClock()
	tr := newTransport(t, sleeping(c, &idemclient.Options{
		Base: noReuse(),
		CheckRetry: func(ctx context.Context, resp *http.Response, err error) (bool, error) {
			if resp != nil && resp.StatusCode == http.StatusConflict {
				return true, nil
			}
			return idemclient.DefaultCheckRetry(ctx, resp, err)
		}, Now: c.Now,
	}))
	resp, err := tr.RoundTrip(post(t, context.Background(), f.srv.URL, `{}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 2, idemclient.Attempts(resp))
}

func TestRefreshError(t *testing.T) {
	f := newFlaky(t, status(401))
	boom := errors.New("token endpoint down")
	tr := newTransport(t, &idemclient.Options{
		Base:    noReuse(),
		Refresh: func(context.Context, *http.Request) error { return boom },
	})
	_, err := tr.RoundTrip(post(t, context.Background(), f.srv.URL, `{}`))
	require.ErrorIs(t, err, boom)
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, http.StatusUnauthorized, rerr.LastStatus)
	assert.Len(t, f.requests(), 1)
}

func TestReplayed(t *testing.T) {
	resp := &http.Response{Header: http.Header{}}
	assert.False(t, idemclient.Replayed(resp))
	resp.Header.Set(idem.HeaderReplayed, "true")
	assert.True(t, idemclient.Replayed(resp))
	assert.False(t, idemclient.Replayed(nil))
}

func TestOptionsValidation(t *testing.T) {
	_, err := idemclient.NewTransport(&idemclient.Options{
		Header:        "Bad Header",
		Methods:       []string{"PO ST"},
		MaxAttempts:   -1,
		MaxElapsed:    -time.Second,
		MaxRetryAfter: -time.Second,
		DrainBytes:    -1,
	})
	require.ErrorIs(t, err, idem.ErrInvalidOptions)
	for _, field := range []string{"Header", "Methods", "MaxAttempts", "MaxElapsed", "MaxRetryAfter", "DrainBytes"} {
		assert.Contains(t, err.Error(), field)
	}
	_, err = idemclient.NewTransport(nil)
	require.NoError(t, err)
}

func TestKeyStoreFailureSendsNothing(t *testing.T) {
	f := newFlaky(t)
	boom := errors.New("disk full")
	tr := newTransport(t, &idemclient.Options{Base: noReuse(), KeyStore: failingStore{boom}})
	ctx := idemclient.WithOperation(context.Background(), "order-1")
	_, err := tr.RoundTrip(post(t, ctx, f.srv.URL, `{}`))
	require.ErrorIs(t, err, boom)
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, "order-1", rerr.Operation)
	assert.Equal(t, 0, rerr.Attempts)
	assert.Empty(t, f.requests())
}

type failingStore struct{ err error }

func (s failingStore) Save(context.Context, string, string) (string, error) { return "", s.err }

func (s failingStore) Done(context.Context, string, int) error { return s.err }

func TestCallerKeyDisagreesWithStore(t *testing.T) {
	f := newFlaky(t)
	store := &idemclient.MemoryKeyStore{}
	_, err := store.Save(context.Background(), "order-1", "stored-key")
	require.NoError(t, err)
	tr := newTransport(t, &idemclient.Options{Base: noReuse(), KeyStore: store})
	req := post(t, idemclient.WithOperation(context.Background(), "order-1"), f.srv.URL, `{}`)
	req.Header.Set(idem.HeaderKey, "other-key")
	_, err = tr.RoundTrip(req)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "already has a key")
	assert.Empty(t, f.requests())
}

// TestInsideHTTPClient: the Transport's one intended shape is inside an
// http.Client, with the operation named on the request's context.
func TestInsideHTTPClient(t *testing.T) {
	f := newFlaky(t, status(502))
	c := newFakeClock()
	store := &idemclient.MemoryKeyStore{}
	client := &http.Client{Transport: newTransport(t, sleeping(c, &idemclient.Options{Base: noReuse(), KeyStore: store, Now: c.Now}))}
	ctx := idemclient.WithOperation(context.Background(), "order-7")
	resp, err := client.Do(post(t, ctx, f.srv.URL, `{"n":7}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	key, done, err := store.Lookup(context.Background(), "order-7")
	require.NoError(t, err)
	assert.Equal(t, []string{key, key}, f.keys())
	assert.Equal(t, http.StatusCreated, done)
	assert.Equal(t, "application/json", f.requests()[1].header.Get("Content-Type"))

	// Through http.Client the typed error is still reachable.
	f2 := newFlaky(t, status(503), status(503))
	client = &http.Client{Transport: newTransport(t, sleeping(c, &idemclient.Options{Base: noReuse(), MaxAttempts: 2, Now: c.Now}))}
	_, err = client.Do(post(t, context.Background(), f2.srv.URL, ""))
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, 2, rerr.Attempts)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestBrokenBase: a base transport that breaks the RoundTripper contract
// gets an error, not a panic.
func TestBrokenBase(t *testing.T) {
	c := newFakeClock()
	tr := newTransport(t, sleeping(c, &idemclient.Options{
		Base:        roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, nil }),
		MaxAttempts: 2, Now: c.Now,
	}))
	_, err := tr.RoundTrip(post(t, context.Background(), "http://example.invalid/", `{}`))
	var rerr *idemclient.RetryError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, 2, rerr.Attempts)
	assert.Contains(t, err.Error(), "neither a response nor an error")
}
