// Command edge measures the embedded store as an edge device runs it, once
// per memory budget (Options.MemoryBytes): how much memory the whole
// process peaks at, how fast it stores records, how many bytes it writes
// per operation, and how much disk it keeps when empty and once every
// record has expired.
//
//	go run ./bench/edge [-budgets 8,16,32,64,0] [-records 1000000] [-conc 16] [-body 300] [-data DIR]
//	go run ./bench/edge -soak 10m [-budgets 16]
//
// Each budget runs in a process of its own, started from this one, so that
// its peak resident memory (VmHWM) is its own. A budget is in MiB; 0 is the
// default, server sizing. The first budget listed is the baseline of the
// throughput ratios, and the budgets run in turn, twice as many rounds as
// -rounds asks with the order reversed every other round, so that a
// machine that slows down in the middle penalises no budget. -soak runs
// each budget for that long instead, on records that expire after
// -soak-ttl while the sweeper runs, and prints its resident memory every
// -sample.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/bench/device"
	"github.com/idemkv/idem/internal/crashtest"
	"github.com/idemkv/idem/pebblestore"
)

// config is what one child runs.
type config struct {
	Budget  int64         // MiB; 0 is the default sizing
	Records int           // claim+complete operations
	Conc    int           // callers
	Body    int           // response body bytes
	Data    string        // directory under which the store is created
	Soak    time.Duration // when set, run this long on expiring records instead
	SoakTTL time.Duration
	Sample  time.Duration
}

// result is what a child reports, as one line of JSON.
type result struct {
	Budget       int64
	OpsPerSec    float64
	PeakRSS      int64   // VmHWM after the load, bytes
	WrittenPerOp float64 // bytes written to the store's files per operation
	// Written is WrittenPerOp by kind of file: the log's records, the
	// zeros kept ahead of it, tables, blob files; the rest is manifests.
	Written      struct{ Log, Zeros, Tables, Blobs float64 }
	LogicalPerOp float64 // the records' own bytes per operation
	SyncsPerOp   float64 // log syncs per operation
	GoHeap       int64   // the Go heap's peak in use over the load (sampled), bytes
	DeviceBytes  int64   // sectors written to the data directory's device over the load, in bytes; -1 when unknown
	EmptyFloor   int64   // bytes on disk just after opening a new store
	ExpiredFloor int64   // bytes on disk once every record expired and Compact ran
	RSS          []int64 // VmRSS samples of a soak, bytes
	Swept        int64   // records a soak's sweeper removed
}

func main() {
	var c config
	budgets := flag.String("budgets", "16,0", "comma-separated memory budgets in MiB; 0 is the default sizing")
	rounds := flag.Int("rounds", 1, "how many times each budget runs; the table shows the median")
	child := flag.Bool("child", false, "run one budget in this process and print its result (used by the parent)")
	flag.Int64Var(&c.Budget, "budget", 0, "the child's budget in MiB")
	flag.IntVar(&c.Records, "records", 1_000_000, "claim+complete operations per budget")
	flag.IntVar(&c.Conc, "conc", 16, "concurrent callers")
	flag.IntVar(&c.Body, "body", 300, "response body size in bytes")
	flag.StringVar(&c.Data, "data", ".", "directory under which the temporary stores are created (not /tmp, which may be memory)")
	flag.DurationVar(&c.Soak, "soak", 0, "run each budget this long on expiring records and report its resident memory over time")
	flag.DurationVar(&c.SoakTTL, "soak-ttl", 20*time.Second, "the soak's record TTL")
	flag.DurationVar(&c.Sample, "sample", 30*time.Second, "how often the soak samples resident memory")
	flag.Parse()
	if *child {
		res, err := runChild(c)
		if err != nil {
			fmt.Fprintln(os.Stderr, "edge:", err)
			os.Exit(1)
		}
		if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
			os.Exit(1)
		}
		return
	}
	list, err := parseBudgets(*budgets)
	if err == nil && (c.Records < 1 || c.Conc < 1 || c.Body < 0 || *rounds < 1) {
		err = errors.New("-records, -conc and -rounds must be positive, -body not negative")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edge:", err)
		os.Exit(2)
	}
	runs, err := runAll(c, list, *rounds)
	if err != nil {
		fmt.Fprintln(os.Stderr, "edge:", err)
		os.Exit(1)
	}
	if c.Soak > 0 {
		fmt.Print(soakTable(runs))
	} else {
		fmt.Print(curveTable(c, list, runs))
	}
}

func parseBudgets(s string) ([]int64, error) {
	var list []int64
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad budget %q: want MiB, 0 for the default", f)
		}
		list = append(list, n)
	}
	return list, nil
}

// runAll runs every budget rounds times in child processes and returns
// each budget's results.
func runAll(c config, budgets []int64, rounds int) (map[int64][]result, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	runs := map[int64][]result{}
	for r := range rounds {
		order := slices.Clone(budgets)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, b := range order {
			args := []string{"-child", "-budget", strconv.FormatInt(b, 10),
				"-records", strconv.Itoa(c.Records), "-conc", strconv.Itoa(c.Conc), "-body", strconv.Itoa(c.Body),
				"-data", c.Data, "-soak", c.Soak.String(), "-soak-ttl", c.SoakTTL.String(), "-sample", c.Sample.String()}
			cmd := exec.Command(self, args...)
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				return nil, fmt.Errorf("budget %d MiB: %w", b, err)
			}
			var res result
			if err := json.Unmarshal(out, &res); err != nil {
				return nil, fmt.Errorf("budget %d MiB: %w", b, err)
			}
			fmt.Fprintf(os.Stderr, "edge: budget %s: %.0f ops/s, peak %s\n", budgetName(b), res.OpsPerSec, mib(res.PeakRSS))
			runs[b] = append(runs[b], res)
		}
	}
	return runs, nil
}

// runChild opens a new store under c.Data with c's budget and measures it.
func runChild(c config) (result, error) {
	res := result{Budget: c.Budget}
	dir, err := os.MkdirTemp(c.Data, "edge-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	if c.Budget > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(pebblestore.GoMemoryLimit(c.Budget << 20))
	}
	var skew atomic.Int64 // added to the clock, to expire every record at the end
	opts := &pebblestore.Options{
		MemoryBytes: c.Budget << 20,
		Now:         func() time.Time { return time.Now().Add(time.Duration(skew.Load())) },
		Logger:      slog.New(slog.DiscardHandler),
	}
	if c.Soak > 0 {
		opts.TTL, opts.Lease, opts.SweepInterval = c.SoakTTL, c.SoakTTL/10, c.SoakTTL/4
	}
	db, err := pebblestore.Open(dir, opts)
	if err != nil {
		return res, err
	}
	defer db.Close()
	if res.EmptyFloor, err = dirBytes(dir); err != nil {
		return res, err
	}
	ctx := context.Background()
	devWritten := deviceCounter(dir)
	devBefore := devWritten()
	before, err := db.Metrics(ctx)
	if err != nil {
		return res, err
	}

	start := time.Now()
	load := loader{db: db, body: c.Body}
	stopHeap := make(chan struct{})
	go load.sampleHeap(stopHeap)
	if c.Soak > 0 {
		res.RSS, err = load.soak(ctx, c.Conc, c.Soak, c.Sample)
	} else {
		err = load.run(ctx, c.Conc, func(i int64) bool { return i <= int64(c.Records) })
	}
	if err != nil {
		return res, err
	}
	elapsed := time.Since(start)
	close(stopHeap)
	ops := float64(load.done.Load())
	res.OpsPerSec = ops / elapsed.Seconds()
	res.PeakRSS = procStatus("VmHWM")
	res.GoHeap = load.heapPeak.Load()
	after, err := db.Metrics(ctx)
	if err != nil {
		return res, err
	}
	perOp := func(name string) float64 {
		a, _ := after.Figure(name)
		b, _ := before.Figure(name)
		return (a - b) / ops
	}
	res.WrittenPerOp = perOp(pebblestore.FigureBytesWritten)
	res.Written.Log, res.Written.Zeros = perOp(pebblestore.FigureLogBytesWritten), perOp(pebblestore.FigureZeroBytesWritten)
	res.Written.Tables, res.Written.Blobs = perOp(pebblestore.FigureTableBytesWritten), perOp(pebblestore.FigureBlobBytesWritten)
	res.SyncsPerOp = perOp(pebblestore.FigureSyncs)
	res.Swept = after.Events[idem.EventSwept]
	res.LogicalPerOp = float64(load.logical.Load()) / ops
	res.DeviceBytes = -1
	// What the page cache still holds (a manifest's tail, a file's
	// metadata) is written by the load too.
	device.SyncAll()
	if devAfter := devWritten(); devBefore >= 0 && devAfter >= 0 {
		res.DeviceBytes = devAfter - devBefore
	}

	skew.Store(int64(opts.TTL + 2*24*time.Hour))
	if _, err := db.Compact(ctx, nil); err != nil {
		return res, err
	}
	// Pebble deletes the files a compaction made obsolete in the
	// background; Close waits for that.
	if err := db.Close(); err != nil {
		return res, err
	}
	res.ExpiredFloor, err = dirBytes(dir)
	return res, err
}

// loader runs claim+complete operations on new keys.
type loader struct {
	db       *pebblestore.Store
	body     int
	next     atomic.Int64
	done     atomic.Int64
	logical  atomic.Int64 // key, fingerprint and body bytes stored
	heapPeak atomic.Int64
}

// sampleHeap records the Go heap in use every 100ms until stop closes.
func (l *loader) sampleHeap(stop <-chan struct{}) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if int64(ms.HeapInuse) > l.heapPeak.Load() {
			l.heapPeak.Store(int64(ms.HeapInuse))
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// op claims and completes the key numbered i with a body of l.body bytes
// that differs from every other one, as real responses do.
func (l *loader) op(ctx context.Context, i int64) error {
	s := idem.Scope{Tenant: "device", Endpoint: "POST /v1/payments", Key: fmt.Sprintf("%016x-%08x", uint64(i)*0x9e3779b97f4a7c15, i)}
	fp := idem.Fingerprint(sha256.Sum256([]byte(s.Key)))
	lease, rec, err := l.db.Claim(ctx, s, fp)
	if err != nil {
		return err
	}
	if rec != nil {
		return fmt.Errorf("key %d claimed twice", i)
	}
	body := fmt.Appendf(nil, `{"id":"pay_%d","amount":%d,"currency":"eur","status":"succeeded","note":"`, i, i%100000)
	body = append(body, bytes.Repeat([]byte{'x'}, max(0, l.body-len(body)-2))...)
	body = append(body, `"}`...)
	if err := lease.Complete(ctx, idem.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: body}); err != nil {
		return err
	}
	l.logical.Add(int64(len(s.Tenant) + len(s.Endpoint) + len(s.Key) + len(fp) + len(body)))
	l.done.Add(1)
	return nil
}

// run performs operations with conc callers, each on the next key number
// for as long as more says so of it, and stops at the first error.
func (l *loader) run(ctx context.Context, conc int, more func(i int64) bool) error {
	var wg sync.WaitGroup
	errs := make([]error, conc)
	for c := range conc {
		wg.Go(func() {
			for i := l.next.Add(1); more(i) && errs[c] == nil; i = l.next.Add(1) {
				errs[c] = l.op(ctx, i)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// soak runs operations with conc callers for d, and samples the resident
// memory every sample.
func (l *loader) soak(ctx context.Context, conc int, d, sample time.Duration) ([]int64, error) {
	var stopped atomic.Bool
	done := make(chan error, 1)
	go func() { done <- l.run(ctx, conc, func(int64) bool { return !stopped.Load() }) }()
	var rss []int64
	t := time.NewTicker(sample)
	defer t.Stop()
	end := time.After(d)
	for {
		select {
		case <-t.C:
			rss = append(rss, procStatus("VmRSS"))
			fmt.Fprintf(os.Stderr, "edge: soak %d ops, resident %s\n", l.done.Load(), mib(rss[len(rss)-1]))
		case <-end:
			stopped.Store(true)
			return rss, <-done
		case err := <-done: // an error ended the callers early
			return rss, err
		}
	}
}

// deviceCounter returns a reading of the bytes the kernel has written
// since boot to the block device that holds dir, -1 when there is no such
// device or its counter cannot be read.
func deviceCounter(dir string) func() int64 {
	h := device.Local()
	d, err := h.Find(dir)
	return func() int64 {
		if err != nil {
			return -1
		}
		n, err := h.SectorsWritten(d)
		if err != nil {
			return -1
		}
		return int64(n) * device.SectorBytes
	}
}

// procStatus returns a field of this process's /proc status in bytes, or
// -1 where there is none.
func procStatus(field string) int64 {
	n, err := crashtest.StatusBytes(os.Getpid(), field)
	if err != nil {
		return -1
	}
	return n
}

// dirBytes returns the bytes the files under dir occupy on disk. Files
// that Pebble deletes meanwhile count for nothing.
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		n += allocated(info)
		return nil
	})
	return n, err
}
