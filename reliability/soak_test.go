package reliability_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
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
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/internal/crashtest"
	"github.com/idemkv/idem/pebblestore"
)

// The soak. 64 clients send first requests and retries for -soak against
// a real idem proxy, then against the middleware in process with sweeps
// running. No request may fail, memory must stay flat and goroutines must
// come back to where they started. Nothing is timed: the bounds are on
// counts and sizes.

const soakClients = 64

// soakLoad runs soakClients clients against url for d: each sends a new
// key, and one time in four retries it at once, which must replay. It
// returns the number of requests and every error.
func soakLoad(t *testing.T, client *http.Client, url string, d time.Duration, warm func()) (requests int64, errs []string) {
	t.Helper()
	var n atomic.Int64
	var mu sync.Mutex
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) < 20 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	seed := seedFor(t)
	stop := time.Now().Add(d)
	warmAt := time.Now().Add(d / 10)
	var warmOnce sync.Once
	var wg sync.WaitGroup
	for c := range soakClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), seed))
			for i := 0; time.Now().Before(stop); i++ {
				if time.Now().After(warmAt) {
					warmOnce.Do(warm)
				}
				key := fmt.Sprintf("soak-%d-%d-%s", c, i, randomToken(rng))
				tenant := fmt.Sprintf("tenant-%d", c%8)
				body := fmt.Sprintf(`{"amount":%d}`, i)
				first, err := do(context.Background(), client, "POST", url, body, "Idempotency-Key", key, crashtest.TenantHeader, tenant)
				n.Add(1)
				if err != nil || first.status != http.StatusCreated || first.replayed() {
					fail("first %s: %v %d %s", key, err, first.status, first.body)
					continue
				}
				if rng.IntN(4) != 0 {
					continue
				}
				again, err := do(context.Background(), client, "POST", url, body, "Idempotency-Key", key, crashtest.TenantHeader, tenant)
				n.Add(1)
				if err != nil || !again.replayed() || !assert.ObjectsAreEqual(first.comparable(), again.comparable()) {
					fail("retry %s: %v %d %s", key, err, again.status, again.body)
				}
			}
		}()
	}
	wg.Wait()
	return n.Load(), errs
}

var goroutinesRE = regexp.MustCompile(`(?m)^go_goroutines (\d+)`)

// goroutinesOf reads go_goroutines from the proxy's /metrics.
func goroutinesOf(t *testing.T, admin string) int {
	t.Helper()
	r, err := do(context.Background(), http.DefaultClient, "GET", admin+"/metrics", "")
	require.NoError(t, err)
	m := goroutinesRE.FindSubmatch(r.body)
	require.NotNil(t, m, "no go_goroutines in /metrics")
	n, err := strconv.Atoi(string(m[1]))
	require.NoError(t, err)
	return n
}

// settle waits until count() is at most limit, and returns the last count.
// It polls an observable figure; the guard only ends a wait that would
// never succeed.
func settle(count func() int, limit int) int {
	deadline := time.Now().Add(guard)
	n := count()
	for n > limit && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n = count()
	}
	return n
}

func TestSoakProxy(t *testing.T) {
	up := startUpstream(t, 2*time.Millisecond)
	data := t.TempDir()
	// No --wait: an answer reaches the client only once it is stored, so
	// the immediate retry below must already get the replay.
	proxy, url := startProxy(t, proxyArgs(data, "127.0.0.1:0", up.url, "--admin", "127.0.0.1:0", "--lease", "5s", "--ttl", "1m"))
	line, err := proxy.WaitLine("admin on http://", guard)
	require.NoError(t, err)
	admin := strings.Fields(strings.SplitAfter(line, "admin on ")[1])[0]

	client := newClient()
	baseGoroutines := goroutinesOf(t, admin)
	// RSS every tenth of the run, to tell a plateau from a climb.
	var samples []string
	sampled := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(*soakFor / 10)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				if rss, err := proxy.RSS(); err == nil {
					samples = append(samples, fmt.Sprint(rss>>20))
				}
			}
		}
	}()
	var rssStart int64
	requests, errs := soakLoad(t, client, url+chargePath, *soakFor, func() {
		rssStart, err = proxy.RSS()
		require.NoError(t, err)
	})
	close(stopSampling)
	<-sampled
	rssEnd, err := proxy.RSS()
	require.NoError(t, err)
	client.CloseIdleConnections()
	execs := up.executions(t)
	// The proxy keeps idle connections to the upstream, two goroutines
	// each, for the next requests: they are a pool, not a leak. Stopping
	// the upstream closes them, and what remains then is what leaked.
	up.Kill()
	endGoroutines := settle(func() int { return goroutinesOf(t, admin) }, baseGoroutines+5)

	assert.Empty(t, errs, "zero errors")
	// Flat: two memtables (64 MiB each) and the block cache (64 MiB) fill
	// as records arrive and are allowed for; anything past that is growth.
	assert.Less(t, rssEnd, rssStart+224<<20, "RSS grew from %d MiB to %d MiB", rssStart>>20, rssEnd>>20)
	assert.LessOrEqual(t, endGoroutines, baseGoroutines+5, "goroutines leaked")
	t.Logf("proxy soak: %s, %d clients, %d requests (%d executions, the rest replays), errors %d", *soakFor, soakClients, requests, execs, len(errs))
	t.Logf("proxy RSS: %d MiB after warm-up, %d MiB at the end (every tenth of the run: %s MiB); goroutines: %d idle before, %d idle after",
		rssStart>>20, rssEnd>>20, strings.Join(samples, " "), baseGoroutines, endGoroutines)
}

// TestSoakInProcess soaks the middleware in this process, on a store whose
// clock runs fifty times fast, so that records expire and the
// background sweep deletes them while the clients run.
func TestSoakInProcess(t *testing.T) {
	base := time.Now()
	const speed = 50
	db, err := pebblestore.Open(t.TempDir(), &pebblestore.Options{
		Now:           func() time.Time { return base.Add(time.Since(base) * speed) },
		Lease:         10 * time.Second,  // a fifth of a second of real time
		TTL:           100 * time.Second, // two seconds
		SweepInterval: 100 * time.Millisecond,
		CompactBytes:  1 << 20,
		Logger:        quietLogger(),
	})
	require.NoError(t, err)
	defer db.Close()
	var runs atomic.Int64
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: tenantFromHeader, Logger: quietLogger()})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d}`, runs.Add(1))
	})))
	client := newClient()
	runtime.GC()
	before := runtime.NumGoroutine()
	var heapStart runtime.MemStats
	requests, errs := soakLoad(t, client, srv.URL+"/v1/charges", *soakFor/2, func() {
		runtime.ReadMemStats(&heapStart)
	})
	var heapEnd runtime.MemStats
	runtime.ReadMemStats(&heapEnd)
	client.CloseIdleConnections()
	srv.Close()
	after := settle(runtime.NumGoroutine, before)
	m, err := db.Metrics(context.Background())
	require.NoError(t, err)

	assert.Empty(t, errs, "zero errors")
	assert.LessOrEqual(t, after, before, "goroutines leaked:\n%s", goroutineDump())
	assert.Positive(t, m.Events[idem.EventSwept], "the sweep must have run under load")
	assert.Less(t, heapEnd.HeapInuse, heapStart.HeapInuse+160<<20)
	t.Logf("in-process soak: %s, %d clients, %d requests, %d executions, errors %d; swept %d records in the meantime",
		*soakFor/2, soakClients, requests, runs.Load(), len(errs), m.Events[idem.EventSwept])
	t.Logf("in-process heap in use: %d MiB after warm-up, %d MiB at the end; goroutines %d before, %d after", heapStart.HeapInuse>>20, heapEnd.HeapInuse>>20, before, after)
}

func goroutineDump() string {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(string(buf[:n])))
	for i := 0; sc.Scan() && i < 200; i++ {
		b.WriteString(sc.Text() + "\n")
	}
	return b.String()
}
