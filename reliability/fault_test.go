package reliability_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

// The fault campaign, beyond the store's own fault tests (read faults on
// tables, a burst of table write faults, one WAL sync failure): each round
// picks a kind of fault and a random operation to start at, runs a mixed
// workload of claims, completions, releases, replays, requests through the
// middleware, sweeps and compactions over it, then clears the fault. The
// library must return errors and the middleware 503, never panic; once the
// fault is gone, and again after a reopen, everything acknowledged is
// there and every record decodes.
//
// Faults that Pebble treats as fatal (a WAL or MANIFEST write or sync that
// fails for good) end the process by design, so they run in a child
// process: TestWALFaultCampaign checks its exit and the restart.

// faultKind names which operations a fault hits and what it returns.
type faultKind struct {
	name  string
	match func(errorfs.Op) bool
	err   error
	burst int // faults per round; the disk-full kinds stop when space is freed
}

func isTableOp(op errorfs.Op) bool { return strings.HasSuffix(op.Path, ".sst") }
func isWALOp(op errorfs.Op) bool   { return strings.HasSuffix(op.Path, ".log") }
func isSync(op errorfs.Op) bool {
	return op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo
}
func isWrite(op errorfs.Op) bool {
	return op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileWriteAt
}

var errNoSpace = &os.PathError{Op: "write", Path: "injected", Err: syscall.ENOSPC}

var faultKinds = []faultKind{
	{name: "read", match: func(op errorfs.Op) bool { return isTableOp(op) && op.Kind.ReadOrWrite() == errorfs.OpIsRead }, err: errorfs.ErrInjected, burst: 40},
	{name: "write", match: func(op errorfs.Op) bool { return isTableOp(op) && isWrite(op) }, err: errorfs.ErrInjected, burst: 10},
	{name: "sync", match: func(op errorfs.Op) bool { return isTableOp(op) && isSync(op) }, err: errorfs.ErrInjected, burst: 5},
	// The disk fills under any write, the WAL's included; vfs.OnDiskFull
	// calls the operator's hook, which frees space, and retries the write.
	{name: "disk-full", match: func(op errorfs.Op) bool { return isWrite(op) }, err: errNoSpace},
	// The disk stays full for the tables a while longer: flushes and
	// compactions fail until space is freed.
	{name: "disk-full-tables", match: func(op errorfs.Op) bool { return isTableOp(op) && isWrite(op) }, err: errNoSpace, burst: 10},
}

// injector fails the matching operations from the start-th on, burst of
// them (or until freed), and counts what it injected.
type injector struct {
	kind     faultKind
	start    int64
	seen     atomic.Int64
	injected atomic.Int64
	freed    atomic.Bool
}

func (in *injector) String() string { return in.kind.name }

func (in *injector) MaybeError(op errorfs.Op) error {
	if in.freed.Load() || !in.kind.match(op) || in.seen.Add(1) < in.start {
		return nil
	}
	if in.kind.burst > 0 && in.injected.Load() >= int64(in.kind.burst) {
		return nil
	}
	in.injected.Add(1)
	return in.kind.err
}

func TestFaultCampaign(t *testing.T) {
	seed := seedFor(t)
	byKind := map[string]int64{}
	var failed, unavailable, unstored, acked int
	for round := range *faultRuns {
		kind := faultKinds[round%len(faultKinds)]
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		r := runFaultRound(t, rng, kind)
		if t.Failed() {
			t.Fatalf("round %d (%s) failed; seed %d", round, kind.name, seed)
		}
		byKind[kind.name] += r.injected
		failed += r.failed
		unavailable += r.unavailable
		unstored += r.unstored
		acked += r.acked
	}
	var total int64
	for _, n := range byKind {
		total += n
	}
	t.Logf("faults injected: %d, by kind %v", total, byKind)
	t.Logf("library calls that returned an error: %d; middleware 503 store_unavailable: %d; acknowledged outcomes checked after the fault: %d, lost: 0", failed, unavailable, acked)
	t.Logf("middleware answers sent whose outcome then failed to store (409 since, never re-run): %d", unstored)
}

type faultRound struct {
	injected                             int64
	failed, unavailable, unstored, acked int
}

func runFaultRound(t *testing.T, rng *rand.Rand, kind faultKind) faultRound {
	in := &injector{kind: kind, start: 1 + rng.Int64N(200)}
	var fs vfs.FS = errorfs.Wrap(vfs.NewMem(), in)
	var hooks atomic.Int64
	if kind.err == errNoSpace {
		fs = vfs.OnDiskFull(fs, func() {
			hooks.Add(1)
			// The operator frees space: at once for the WAL, after a
			// burst for the tables.
			if kind.burst == 0 {
				in.freed.Store(true)
			}
		})
	}
	clock := idemtest.NewClock()
	opts := pebblefs.With(&pebblestore.Options{Now: clock.Now, SweepInterval: -1, CompactBytes: 1, InlineBodyBytes: 1 << 10, Logger: quietLogger()}, fs)
	db, err := pebblestore.Open("db", opts)
	require.NoError(t, err)
	ctx := context.Background()

	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: tenantFromHeader, Logger: quietLogger()})
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "done %s", r.Header.Get("Idempotency-Key"))
	}))

	var res faultRound
	acked := map[idem.Scope][]byte{}     // Complete returned nil
	answered := map[string][]byte{}      // the middleware sent a 201
	state := map[idem.Scope]idem.State{} // other acknowledged ends
	scope := func(i int) idem.Scope { return idem.Scope{Tenant: "t", Endpoint: "POST /x", Key: fmt.Sprint("k", i)} }
	fp := func(i int) idem.Fingerprint { return idem.Fingerprint{byte(i), byte(i >> 8), 1} }
	body := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 100+(i%5)*900) }
	next := 0
	for step := range 400 {
		switch op := rng.IntN(12); {
		case op < 5: // a new operation, ended one way or another
			i := next
			next++
			l, _, err := db.Claim(ctx, scope(i), fp(i))
			if err != nil {
				res.failed++
				continue
			}
			switch rng.IntN(6) {
			case 0:
				if err = l.Release(ctx); err == nil {
					state[scope(i)] = 0
				}
			case 1:
				if err = l.MarkUnknown(ctx); err == nil {
					state[scope(i)] = idem.StateUnknown
				}
			default:
				if err = l.Complete(ctx, idem.Response{Status: 201, Body: body(i)}); err == nil {
					acked[scope(i)] = body(i)
				}
			}
			if err != nil {
				res.failed++
			}
		case op < 7: // a replay of something acknowledged
			for s, b := range acked {
				_, rec, err := db.Claim(ctx, s, fp(keyIndex(s)))
				if err != nil {
					res.failed++
				} else {
					require.NotNil(t, rec, "%+v", s)
					assert.Equal(t, b, rec.Response.Body)
				}
				break
			}
		case op < 10: // a request through the middleware, new or repeated
			key := fmt.Sprint("m", rng.IntN(next+1))
			req := httptest.NewRequest("POST", "/x", strings.NewReader(`{"n":1}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("X-Tenant", "t")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			switch {
			case w.Code == http.StatusCreated && w.Header().Get("Idempotent-Replayed") == "":
				answered[key] = w.Body.Bytes()
			case w.Code == http.StatusCreated:
				assert.Equal(t, answered[key], w.Body.Bytes())
			case w.Code == http.StatusServiceUnavailable:
				assert.Contains(t, w.Body.String(), idem.CodeStoreUnavailable)
				res.unavailable++
			case w.Code == http.StatusConflict:
				// An earlier answer whose outcome could not be stored.
			default:
				t.Errorf("step %d: the middleware answered %d %s", step, w.Code, w.Body)
			}
		case op < 11:
			if _, err := db.Sweep(ctx); err != nil {
				res.failed++
			}
		default:
			if _, err := db.Compact(ctx, nil); err != nil {
				res.failed++
			}
		}
	}
	in.freed.Store(true)
	res.injected = in.injected.Load()
	if kind.err == errNoSpace && res.injected > 0 {
		assert.Positive(t, hooks.Load(), "a full disk must reach the OnDiskFull hook")
	}

	check := func(db *pebblestore.Store) {
		for s, b := range acked {
			_, rec, err := db.Claim(ctx, s, fp(keyIndex(s)))
			require.NoError(t, err, "%+v after the fault", s)
			require.NotNil(t, rec, "%+v must replay", s)
			assert.Equal(t, b, rec.Response.Body)
		}
		for s, st := range state {
			rec, err := db.Get(ctx, s)
			if st == 0 {
				assert.ErrorIs(t, err, idem.ErrNotFound, "%+v was released", s)
				continue
			}
			require.NoError(t, err)
			assert.Equal(t, st, rec.State)
		}
		for key, b := range answered {
			req := httptest.NewRequest("POST", "/x", strings.NewReader(`{"n":1}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("X-Tenant", "t")
			w := httptest.NewRecorder()
			mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: tenantFromHeader, Logger: quietLogger()})
			require.NoError(t, err)
			mw(http.NotFoundHandler()).ServeHTTP(w, req)
			if w.Code == http.StatusConflict {
				// The answer went out, then its outcome failed to store:
				// the key is spent and never re-run. Counted, not lost.
				res.unstored++
				continue
			}
			assert.Equal(t, http.StatusCreated, w.Code, "%s: %s", key, w.Body)
			assert.Equal(t, b, w.Body.Bytes())
		}
		for _, err := range db.Records(ctx, idem.Filter{Expired: true}) {
			require.NoError(t, err)
		}
	}
	check(db)
	require.NoError(t, db.Close())
	db, err = pebblestore.Open("db", opts)
	require.NoError(t, err, "the store must open after the fault")
	res.unstored = 0 // counted once, on the reopened store
	check(db)
	require.NoError(t, db.Close())
	res.acked = len(acked)
	return res
}

func keyIndex(s idem.Scope) int {
	var i int
	fmt.Sscanf(s.Key, "k%d", &i)
	return i
}

// walChildEnv carries the child's data directory and fault to it.
const walChildEnv = "RELIABILITY_WAL_CHILD"

// The kinds of fatal fault the child process meets.
var walKinds = []string{"wal-sync", "wal-write", "wal-enospc"}

// TestWALFaultCampaign runs child processes whose WAL write or sync fails
// for good at a random point of a concurrent workload. Each must end with
// the documented status and message; the store it leaves must open, with
// every outcome the child acknowledged before the fault, and take new
// work.
func TestWALFaultCampaign(t *testing.T) {
	if env := os.Getenv(walChildEnv); env != "" {
		walFaultChild(env)
		return
	}
	rng := rand.New(rand.NewPCG(seedFor(t), 4))
	rounds := max(4, *faultRuns/10)
	exits := map[int]int{}
	byKind := map[string]int{}
	checked := 0
	for round := range rounds {
		kind := walKinds[round%len(walKinds)]
		dir := t.TempDir()
		at := 5 + rng.IntN(300)
		cmd := exec.Command(os.Args[0], "-test.run=^TestWALFaultCampaign$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%d", walChildEnv, dir, kind, at))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "round %d (%s at %d) must not survive its fault; stderr:\n%s", round, kind, at, stderr.String())
		exits[exit.ExitCode()]++
		byKind[kind]++
		assert.Equal(t, 74, exit.ExitCode(), "%s: stderr:\n%s", kind, stderr.String())
		// idem ends the process at the failed operation itself, naming it,
		// before Pebble can reach a path that dies another way.
		assert.Regexp(t, `idem: fatal storage error.*: (write|sync) \S+\.log: `, stderr.String())

		db, err := pebblestore.Open(filepath.Join(dir, "db"), &pebblestore.Options{SweepInterval: -1, MustExist: true, Logger: quietLogger()})
		require.NoError(t, err, "the store must open after a fatal fault")
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 || f[0] != "ack" {
				continue
			}
			checked++
			s := idem.Scope{Tenant: "t", Endpoint: "POST /x", Key: f[1]}
			rec, err := db.Get(context.Background(), s)
			switch f[2] {
			case "completed":
				require.NoError(t, err, "%s was acknowledged", f[1])
				assert.Equal(t, idem.StateCompleted, rec.State)
				assert.Equal(t, walBody(f[1]), rec.Response.Body)
			case "released":
				assert.ErrorIs(t, err, idem.ErrNotFound, "%s was released", f[1])
			case "unknown":
				require.NoError(t, err)
				assert.Equal(t, idem.StateUnknown, rec.State)
			}
		}
		// And it takes new work.
		l, _, err := db.Claim(context.Background(), idem.Scope{Tenant: "t", Endpoint: "POST /x", Key: "after"}, idem.Fingerprint{1})
		require.NoError(t, err)
		require.NoError(t, l.Complete(context.Background(), idem.Response{Status: 200}))
		require.NoError(t, db.Close())
	}
	t.Logf("fatal WAL faults: %d processes (by kind %v), exit statuses %v, restarts clean: %d, acknowledged outcomes checked after restart: %d, lost: 0",
		rounds, byKind, exits, rounds, checked)
}

func walBody(key string) []byte { return []byte("outcome of " + key) }

// walFaultChild runs the workload with the fault armed, printing one "ack"
// line per acknowledged outcome. It must never return: the fault ends the
// process.
func walFaultChild(env string) {
	parts := strings.Split(env, ",")
	dir, kind := parts[0], parts[1]
	var at int64
	fmt.Sscan(parts[2], &at)
	var seen atomic.Int64
	var match func(errorfs.Op) bool
	var ferr error = errorfs.ErrInjected
	switch kind {
	case "wal-sync":
		match = func(op errorfs.Op) bool { return isWALOp(op) && isSync(op) }
	case "wal-write":
		match = func(op errorfs.Op) bool { return isWALOp(op) && isWrite(op) }
	default:
		match = func(op errorfs.Op) bool { return isWALOp(op) && isWrite(op) }
		ferr = errNoSpace
	}
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if match(op) && seen.Add(1) >= at {
			return ferr
		}
		return nil
	})
	var fs vfs.FS = errorfs.Wrap(vfs.Default, inj)
	if kind == "wal-enospc" {
		// Nobody frees space: the retry fails too.
		fs = vfs.OnDiskFull(fs, func() {})
	}
	db, err := pebblestore.Open(filepath.Join(dir, "db"), pebblefs.With(&pebblestore.Options{SweepInterval: -1}, fs))
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem: fatal storage error? open failed:", err)
		os.Exit(74)
	}
	var mu sync.Mutex
	ack := func(key, what string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("ack %s %s\n", key, what)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				l, _, err := db.Claim(context.Background(), idem.Scope{Tenant: "t", Endpoint: "POST /x", Key: key}, idem.Fingerprint{byte(w), byte(i)})
				if err != nil {
					fmt.Fprintln(os.Stderr, "claim:", err)
					continue
				}
				switch i % 5 {
				case 0:
					if l.Release(context.Background()) == nil {
						ack(key, "released")
					}
				case 1:
					if l.MarkUnknown(context.Background()) == nil {
						ack(key, "unknown")
					}
				default:
					if l.Complete(context.Background(), idem.Response{Status: 201, Body: walBody(key)}) == nil {
						ack(key, "completed")
					}
				}
			}
		}()
	}
	wg.Wait()
	fmt.Fprintln(os.Stderr, "child survived its fault")
	os.Exit(0)
}
