package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/google/uuid"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

// httpSystem is idem as a service sees it: a net/http server on loopback
// with the idemhttp middleware in front of a handler that answers 201 with
// the body, and a keep-alive client. A claim+complete is one POST with a
// fresh key; a replay is the same POST again.
type httpSystem struct {
	db     *pebblestore.Store
	srv    *http.Server
	url    string
	client *http.Client
	syncs  syncCounter
}

// tenantHeader carries the caller in the benchmark's requests. A real
// service takes the tenant from its authentication instead.
const tenantHeader = "X-Bench-Tenant"

func openIdemHTTP(e env) (system, error) {
	db, err := pebblestore.Open(e.dir, nil)
	if err != nil {
		return nil, err
	}
	h, err := newHandler(db, e.bodies)
	if err != nil {
		db.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		db.Close()
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return &httpSystem{db: db, srv: srv, url: "http://" + ln.Addr().String() + "/v1/payments", client: newClient(e.maxConc, 1)}, nil
}

// newClient is the keep-alive client of the HTTP systems: one idle
// connection per caller to each of hosts servers, so that no request
// waits for a new connection once the first ones are open.
func newClient(maxConc, hosts int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        maxConc * hosts,
		MaxIdleConnsPerHost: maxConc,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

// newHandler is the server's handler: the middleware, its tenant from
// tenantHeader, in front of a handler that answers 201 with the body of
// the request's key.
func newHandler(db *pebblestore.Store, bodies bodies) (http.Handler, error) {
	mw, err := idemhttp.New(idemhttp.Options{
		Store:  db,
		Tenant: func(r *http.Request) (string, error) { return r.Header.Get(tenantHeader), nil },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw(answer201(bodies)))
	return mux, nil
}

// answer201 is the service behind every HTTP system: it answers 201 with
// the body of the request's key.
func answer201(bodies bodies) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(bodies.of(r.Header.Get("Idempotency-Key")))
	})
}

// requestBody is the payment a request carries; the key makes each
// operation's request, and so its fingerprint, its own.
func requestBody(o op) string {
	return `{"amount":4200,"currency":"usd","customer":"cus_8812","order":"` + o.key + `"}`
}

// postOp sends o's POST to url and reads the answer, which must be 201.
func postOp(ctx context.Context, client *http.Client, url string, o op) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(requestBody(o)))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", o.key)
	req.Header.Set(tenantHeader, o.tenant)
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	// Read to the end, so the connection goes back to the pool.
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusCreated {
		return nil, nil, fmt.Errorf("bench: POST answered %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return resp, b, nil
}

func (s *httpSystem) claimComplete(ctx context.Context, o op, body []byte) error {
	resp, _, err := postOp(ctx, s.client, s.url, o)
	if err == nil && resp.Header.Get("Idempotent-Replayed") != "" {
		err = errors.New("bench: a fresh key was answered as a replay")
	}
	return err
}

func (s *httpSystem) replay(ctx context.Context, o op) ([]byte, error) {
	resp, b, err := postOp(ctx, s.client, s.url, o)
	if err == nil && resp.Header.Get("Idempotent-Replayed") != "true" {
		err = errors.New("bench: a retry ran the handler again")
	}
	return b, err
}

func (s *httpSystem) syncsPerOp() float64 { return dbSyncsPerOp(s.db, &s.syncs) }

func (s *httpSystem) bytesWritten(ctx context.Context) (uint64, error) {
	return dbBytesWritten(ctx, s.db)
}

func (s *httpSystem) close() error {
	s.client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
	return s.db.Close()
}

// noopBench measures the middleware's own cost per request: the
// middleware in front of a handler that only answers 201, called directly
// without a network. bare is the same handler without the middleware, so
// the overhead is the difference. The store is the embedded one on an
// in-memory filesystem, whose sync is free, or with mem the in-memory
// MemStore, which shows the middleware's cost apart from any engine's.
// MemStore keeps its records on the Go heap, where a store that only grows
// would make every request pay for the collector's scans of all of them:
// its records expire and are swept every sweepEvery requests instead, as a
// long-running store's do.
type noopBench struct {
	db      idem.Store
	bare    http.Handler
	wrapped http.Handler
	// sweep, when set, expires and deletes every stored record.
	sweep  func() error
	served int
}

// sweepEvery is how many requests a MemStore keeps between sweeps.
const sweepEvery = 4096

func newNoopBench(mem bool) (*noopBench, error) {
	n := &noopBench{}
	if mem {
		clock := idemtest.NewClock()
		ms, err := idemtest.NewMemStore(&idemtest.MemOptions{Now: clock.Now})
		if err != nil {
			return nil, err
		}
		n.db, n.sweep = ms, func() error {
			clock.Advance(25 * time.Hour) // past the default TTL
			_, err := ms.Sweep(context.Background())
			return err
		}
	} else {
		db, err := pebblestore.Open("db", pebblefs.With(&pebblestore.Options{SweepInterval: -1}, vfs.NewMem()))
		if err != nil {
			return nil, err
		}
		n.db = db
	}
	mw, err := idemhttp.New(idemhttp.Options{
		Store:  n.db,
		Tenant: func(r *http.Request) (string, error) { return r.Header.Get(tenantHeader), nil },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		n.db.Close()
		return nil, err
	}
	n.bare = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	n.wrapped = mw(n.bare)
	return n, nil
}

// request builds a POST with a fresh key, the same for both handlers so
// that building it cancels out of the difference.
func (n *noopBench) request() *http.Request {
	key := uuid.NewString()
	r, _ := http.NewRequest(http.MethodPost, "http://bench.invalid/v1/payments", strings.NewReader(requestBody(op{key: key})))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set(tenantHeader, "tenant-000")
	return r
}

// serve runs one request through h and checks that the handler answered.
func (n *noopBench) serve(h http.Handler) error {
	if n.served++; n.sweep != nil && n.served%sweepEvery == 0 {
		if err := n.sweep(); err != nil {
			return err
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, n.request())
	if w.Code != http.StatusCreated {
		return fmt.Errorf("bench: no-op handler answered %d", w.Code)
	}
	return nil
}

func (n *noopBench) close() error { return n.db.Close() }

// middlewareOverhead measures the no-op handler alone and behind the
// middleware, one request at a time, for about d each, and returns the
// mean time per request of each.
func middlewareOverhead(d time.Duration) (bare, wrapped time.Duration, err error) {
	n, err := newNoopBench(false)
	if err != nil {
		return 0, 0, err
	}
	defer n.close()
	mean := func(h http.Handler) (time.Duration, error) {
		count, start := 0, time.Now()
		for ; count == 0 || time.Since(start) < d; count++ {
			if err := n.serve(h); err != nil {
				return 0, err
			}
		}
		return time.Since(start) / time.Duration(count), nil
	}
	if bare, err = mean(n.bare); err != nil {
		return 0, 0, err
	}
	wrapped, err = mean(n.wrapped)
	return bare, wrapped, err
}
