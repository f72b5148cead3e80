package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/idemkv/idem/internal/crashtest"
)

// proxySystem is the deployment pgstore is for: one or more real `idem
// proxy` processes, all with --store on one PostgreSQL database, in front
// of one upstream that answers 201 with the body. The systems proxy-pg-1,
// -2 and -3 differ only in how many replicas they run, so their rows show
// how far adding proxies scales on one server. Each request goes to a
// replica picked at random; a replay is the same POST again, usually
// through another replica than the one that recorded it.
type proxySystem struct {
	procs    []*crashtest.Process
	urls     []string // each replica's POST URL
	client   *http.Client
	upstream *http.Server
	dsn      string // -pg, to drop the schema with
	schema   string
}

// proxyStopGuard bounds how long a replica may take to stop after SIGTERM
// before it is killed; it only turns a hang into a kill.
const proxyStopGuard = 10 * time.Second

// proxyBin builds cmd/idem once per run, for every proxy system.
var proxyBin struct {
	once sync.Once
	path string
	err  error
}

// buildProxy builds the idem binary into dir, which must outlive every
// proxy system of the run, or returns the one built already.
func buildProxy(dir string) (string, error) {
	proxyBin.once.Do(func() {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			proxyBin.err = err
			return
		}
		proxyBin.path, proxyBin.err = crashtest.Build(dir, "github.com/idemkv/idem/cmd/idem")
	})
	return proxyBin.path, proxyBin.err
}

func openProxyPG(replicas int) func(env) (system, error) {
	return func(e env) (system, error) {
		if e.pgDSN == "" {
			return nil, errors.New("needs -pg DSN")
		}
		// The run's temporary root holds every system's directory and is
		// removed at the end, so the binary goes there.
		bin, err := buildProxy(filepath.Join(filepath.Dir(e.dir), "bin"))
		if err != nil {
			return nil, err
		}
		// A schema per system, so that the systems' tables grow apart as
		// the other rows' do.
		schema := "idem_bench_proxy_" + strconv.Itoa(replicas)
		ctx := context.Background()
		if err := pgExec(ctx, e.pgDSN, true,
			"DROP SCHEMA IF EXISTS "+schema+" CASCADE",
			"CREATE SCHEMA "+schema); err != nil {
			return nil, err
		}
		// Each replica's pool may open one connection per caller, as the
		// pgstore system's does, so that no replica waits for its pool
		// and the number of replicas is the only thing that changes.
		// pgstore's own default would be max(4, processors). The three
		// systems stay open through the run and their pools keep what
		// they opened, so the server needs max_connections well above
		// the highest concurrency: about five and a half times it.
		dsn, err := dsnWith(e.pgDSN, map[string]string{
			"search_path":    schema,
			"pool_max_conns": strconv.Itoa(e.maxConc),
		})
		if err != nil {
			return nil, err
		}
		s := &proxySystem{dsn: e.pgDSN, schema: schema}
		if err := s.start(bin, dsn, replicas, e); err != nil {
			return nil, errors.Join(err, s.close())
		}
		return s, nil
	}
}

// start runs the upstream and the replicas. On error, what it started is
// left in s for close to stop.
func (s *proxySystem) start(bin, dsn string, replicas int, e env) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	bodies := e.bodies
	s.upstream = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write(bodies.of(r.Header.Get("Idempotency-Key")))
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go s.upstream.Serve(ln)
	for range replicas {
		p, err := crashtest.Start(bin, nil, "proxy",
			"--store", dsn, "--listen", "127.0.0.1:0", "--admin", "", "--events=false",
			"--upstream", "http://"+ln.Addr().String(), "--tenant-from", "header:"+tenantHeader)
		if err != nil {
			return err
		}
		s.procs = append(s.procs, p)
		// Replicas start one after the other: each applies the schema's
		// migrations when it starts.
		u, err := p.WaitListening(time.Minute)
		if err != nil {
			return err
		}
		s.urls = append(s.urls, u+"/v1/payments")
	}
	s.client = &http.Client{Transport: &http.Transport{
		// One idle connection per caller to each replica, so that no
		// request waits for a new connection once the first ones are open.
		MaxIdleConns:        e.maxConc * replicas,
		MaxIdleConnsPerHost: e.maxConc,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
	return nil
}

// post sends o's POST to a replica picked at random. A failure carries
// the end of that replica's standard error, where the proxy logs why its
// store failed (PostgreSQL refusing connections past max_connections, for
// one).
func (s *proxySystem) post(ctx context.Context, o op) (*http.Response, []byte, error) {
	i := rand.IntN(len(s.urls))
	resp, b, err := postOp(ctx, s.client, s.urls[i], o)
	if err != nil {
		tail := s.procs[i].Stderr()
		tail = tail[max(0, len(tail)-500):]
		return nil, nil, fmt.Errorf("replica %d: %w; its stderr ends:\n%s", i+1, err, tail)
	}
	return resp, b, nil
}

func (s *proxySystem) claimComplete(ctx context.Context, o op, body []byte) error {
	resp, _, err := s.post(ctx, o)
	if err == nil && resp.Header.Get("Idempotent-Replayed") != "" {
		err = errors.New("bench: a fresh key was answered as a replay")
	}
	return err
}

func (s *proxySystem) replay(ctx context.Context, o op) ([]byte, error) {
	resp, b, err := s.post(ctx, o)
	if err == nil && resp.Header.Get("Idempotent-Replayed") != "true" {
		err = errors.New("bench: a retry reached the upstream again")
	}
	return b, err
}

// syncsPerOp is 0: pg_stat_wal counts the server's syncs, but backends
// report to it at most once a second, too seldom for a cell of seconds.
func (s *proxySystem) syncsPerOp() float64 { return 0 }

// close stops the replicas with SIGTERM (a kill after proxyStopGuard),
// then the upstream, and drops the schema.
func (s *proxySystem) close() error {
	var errs []error
	if s.client != nil {
		s.client.CloseIdleConnections()
	}
	for _, p := range s.procs {
		if p.Exited() {
			continue
		}
		if err := p.Signal(syscall.SIGTERM); err != nil {
			p.Kill()
			continue
		}
		if _, err := p.Wait(proxyStopGuard); err != nil {
			errs = append(errs, err)
		}
	}
	if s.upstream != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.upstream.Shutdown(ctx)
		cancel()
	}
	if err := pgExec(context.Background(), s.dsn, false, "DROP SCHEMA IF EXISTS "+s.schema+" CASCADE"); err != nil {
		errs = append(errs, fmt.Errorf("drop %s: %w", s.schema, err))
	}
	return errors.Join(errs...)
}
