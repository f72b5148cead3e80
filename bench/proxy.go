package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkv/idem/internal/crashtest"
	"github.com/idemkv/idem/pebblestore"
)

// proxySystem is one or more real `idem proxy` processes in front of one
// upstream in the harness's process that answers 201 with the body.
// idem-proxy is one proxy on the embedded store, beside idem-http, so that
// the proxy's own cost shows. proxy-pg-1, -2 and -3 are the deployment
// pgstore is for: their replicas all have --store on one PostgreSQL
// database, and the systems differ only in how many replicas they run, so
// their rows show how far adding proxies scales on one server. Each
// request goes to a replica picked at random; a replay is the same POST
// again, usually through another replica than the one that recorded it.
type proxySystem struct {
	procs    []*crashtest.Process
	urls     []string // each replica's POST URL
	client   *http.Client
	upstream *http.Server
	dsn      string // -pg, to drop the schema with; empty on the embedded store
	schema   string
	// metrics is the proxy's /metrics on the embedded store, where
	// syncsPerOp reads the store's commits and syncs; empty on PostgreSQL.
	metrics string
	syncs   syncCounter
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
		if err := s.start(bin, []string{"--store", dsn}, replicas, e); err != nil {
			return nil, errors.Join(err, s.close())
		}
		return s, nil
	}
}

// openIdemProxy is one proxy on the embedded store, its data in the
// system's directory.
func openIdemProxy(e env) (system, error) {
	bin, err := buildProxy(filepath.Join(filepath.Dir(e.dir), "bin"))
	if err != nil {
		return nil, err
	}
	s := &proxySystem{}
	if err := s.start(bin, []string{"--data", e.dir}, 1, e); err != nil {
		return nil, errors.Join(err, s.close())
	}
	line, err := s.procs[0].WaitLine("admin on http://", time.Minute)
	if err != nil {
		return nil, errors.Join(err, s.close())
	}
	s.metrics = strings.Fields(line[strings.Index(line, "http://"):])[0] + "/metrics"
	s.syncsPerOp() // start counting here
	return s, nil
}

// proxyHopSystem is idem-proxy's two processes without the idempotency
// work: the same binary and upstream, sent GET requests, which the proxy
// forwards unrecorded. Set beside upstream in the same run, its row is
// what putting the proxy's process between client and upstream costs by
// itself, a bound on how close idem-proxy can come to idem-http: the proxy
// does all that idem-http does, and this too. Nothing is stored, so it has
// no replay rows.
type proxyHopSystem struct{ *proxySystem }

func openProxyHop(e env) (system, error) {
	s, err := openIdemProxy(e)
	if err != nil {
		return nil, err
	}
	return proxyHopSystem{s.(*proxySystem)}, nil
}

func (s proxyHopSystem) claimComplete(ctx context.Context, o op, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.urls[0], nil)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", o.key)
	req.Header.Set(tenantHeader, o.tenant)
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return err
	case resp.StatusCode != http.StatusCreated:
		return fmt.Errorf("bench: GET through the proxy answered %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	case resp.Header.Get("Idempotent-Replayed") != "":
		return errors.New("bench: the proxy recorded a GET")
	}
	return nil
}

func (proxyHopSystem) replay(context.Context, op) ([]byte, error) {
	return nil, errors.New("bench: the proxy stores no GET to replay")
}

func (proxyHopSystem) noReplay()           {}
func (proxyHopSystem) syncsPerOp() float64 { return 0 }

// startUpstream serves the handler every HTTP system answers with on
// loopback and returns the server and its base URL.
func startUpstream(bodies bodies) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: answer201(bodies), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return srv, "http://" + ln.Addr().String(), nil
}

// start runs the upstream and the replicas, each with storeArgs. On error,
// what it started is left in s for close to stop.
func (s *proxySystem) start(bin string, storeArgs []string, replicas int, e env) error {
	srv, upstreamURL, err := startUpstream(e.bodies)
	if err != nil {
		return err
	}
	s.upstream = srv
	for range replicas {
		// On PostgreSQL the server's syncs are not the proxy's to count,
		// so only the embedded store's proxy serves its metrics.
		admin := ""
		if s.dsn == "" {
			admin = "127.0.0.1:0"
		}
		args := append([]string{"proxy"}, storeArgs...)
		p, err := crashtest.Start(bin, nil, append(args, "--listen", "127.0.0.1:0", "--admin", admin, "--events=false",
			"--upstream", upstreamURL, "--tenant-from", "header:"+tenantHeader)...)
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
	s.client = newClient(e.maxConc, replicas)
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

// syncsPerOp reads the embedded store's figures from the proxy's
// /metrics. On PostgreSQL it is 0: pg_stat_wal counts the server's syncs,
// but backends report to it at most once a second, too seldom for a cell
// of seconds.
func (s *proxySystem) syncsPerOp() float64 {
	f, err := s.scrape()
	if err != nil {
		return 0
	}
	return s.syncs.perOp(f[pebblestore.FigureCommits], f[pebblestore.FigureSyncs])
}

// bytesWritten is the embedded store's own count of the bytes it wrote to
// its files, from the proxy's /metrics; a proxy on PostgreSQL has none.
func (s *proxySystem) bytesWritten(context.Context) (uint64, error) {
	f, err := s.scrape()
	if err != nil {
		return 0, err
	}
	n, ok := f[pebblestore.FigureBytesWritten]
	if !ok {
		return 0, errors.New("bench: the proxy reports no bytes written")
	}
	return uint64(n), nil
}

// scrape reads the first replica's /metrics: the unlabelled series, by
// name.
func (s *proxySystem) scrape() (map[string]float64, error) {
	if s.metrics == "" {
		return nil, errors.New("bench: the proxy has no metrics address")
	}
	resp, err := s.client.Get(s.metrics)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	f := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if v, err := strconv.ParseFloat(value, 64); ok && err == nil && !strings.HasPrefix(name, "#") {
			f[name] = v
		}
	}
	return f, sc.Err()
}

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
	if s.dsn != "" {
		if err := pgExec(context.Background(), s.dsn, false, "DROP SCHEMA IF EXISTS "+s.schema+" CASCADE"); err != nil {
			errs = append(errs, fmt.Errorf("drop %s: %w", s.schema, err))
		}
	}
	return errors.Join(errs...)
}

// upstreamSystem is the upstream alone, without a proxy: the floor under
// the idem-proxy row. Nothing is stored, so it has no replay rows.
type upstreamSystem struct {
	srv    *http.Server
	url    string
	client *http.Client
}

func openUpstream(e env) (system, error) {
	srv, u, err := startUpstream(e.bodies)
	if err != nil {
		return nil, err
	}
	return &upstreamSystem{srv: srv, url: u + "/v1/payments", client: newClient(e.maxConc, 1)}, nil
}

func (s *upstreamSystem) claimComplete(ctx context.Context, o op, body []byte) error {
	_, _, err := postOp(ctx, s.client, s.url, o)
	return err
}

func (s *upstreamSystem) replay(context.Context, op) ([]byte, error) {
	return nil, errors.New("bench: the upstream stores nothing to replay")
}

func (s *upstreamSystem) noReplay()           {}
func (s *upstreamSystem) syncsPerOp() float64 { return 0 }

func (s *upstreamSystem) close() error {
	s.client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
