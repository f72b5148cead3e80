// Command bench measures idem against the stores users weigh it against,
// on this machine, in one run, interleaved, so that every ratio it prints
// compares figures taken under the same conditions.
//
//	go run ./bench [-duration 3s] [-conc 1,16,64] [-rounds 3] [-systems ...] [-out DIR] [-pg DSN] [-redis ADDR] [-drain 5s]
//
// Workloads: "claim+complete" is one durable claim (fingerprint, state in
// progress, expiry) followed by one durable completion with a 1 KiB body,
// on fresh UUIDv4 keys spread over 100 tenants; "replay" answers retries
// of the keys completed last, "replay-all" retries of any key completed in
// the run. A claim+complete row also gives the bytes the block device
// holding the system's files wrote per operation (wear.go). It prints a
// Markdown table with ratios to the baselines and the goals, and
// writes it with two SVG charts (throughput.svg, p99.svg) to -out.
// Embedded stores live in a temporary directory under -data (not /tmp,
// which may be memory), removed at the end. bench/run.sh starts
// PostgreSQL and Redis and runs everything.
package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idem/bench/device"
)

func main() {
	duration := flag.Duration("duration", 3*time.Second, "how long each measurement runs")
	concList := flag.String("conc", "1,16,64", "comma-separated concurrency levels")
	systemList := flag.String("systems", "idem,idem-http,pebble,pebble-tuned,disk", "comma-separated systems to measure: "+strings.Join(systemNames(), ", "))
	bodySize := flag.Int("body", 1024, "response body size in bytes")
	outDir := flag.String("out", "idem-bench-results", `directory to write results.md, throughput.svg and p99.svg into ("" to print only)`)
	dataDir := flag.String("data", ".", "directory under which the temporary stores are created")
	pgDSN := flag.String("pg", "", "PostgreSQL connection string, for the postgres, pgstore and proxy-pg-N systems (e.g. postgres://user@127.0.0.1:55432/db)")
	redisAddr := flag.String("redis", "", "Redis address, for the redis system; the server must run appendonly yes, appendfsync always")
	rounds := flag.Int("rounds", 3, "how many times each cell runs, interleaved; the table shows the median run")
	pgData := flag.String("pg-data", "", "the -pg server's data directory, for bytes-written/op (default: the server's data_directory, when it runs on this machine)")
	redisData := flag.String("redis-data", "", "the -redis server's directory, for bytes-written/op (default: the server's dir, when it runs on this machine)")
	pgCheckpoint := flag.Bool("pg-checkpoint", true, "end each claim+complete cell of a PostgreSQL system with a CHECKPOINT, so that its bytes-written/op counts the table pages the cell dirtied (it also makes the next cell log full page images)")
	drain := flag.Duration("drain", 5*time.Second, "longest wait, before and after each claim+complete cell, for the system's deferred writes and for the devices to fall quiet")
	flag.Parse()

	cfg, err := parseConfig(*concList, *systemList)
	if err == nil && *rounds < 1 {
		err = fmt.Errorf("bad -rounds %d: at least 1", *rounds)
	}
	if err == nil && *drain < 0 {
		err = fmt.Errorf("bad -drain %s: not negative", *drain)
	}
	if err == nil && *bodySize < 0 {
		err = fmt.Errorf("bad -body %d: not negative", *bodySize)
	}
	if err == nil {
		cfg.pgDSN, cfg.redisAddr = *pgDSN, *redisAddr
		err = cfg.check()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		flag.Usage()
		os.Exit(2)
	}
	cfg.duration, cfg.bodies, cfg.rounds = *duration, newBodies(*bodySize), *rounds
	cfg.wear, cfg.drain = wearFlags{pgData: *pgData, redisData: *redisData, pgCheckpoint: *pgCheckpoint}, *drain
	res, err := run(context.Background(), cfg, *dataDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	table := markdown(res)
	fmt.Print(table)
	if *outDir != "" {
		if err := writeOut(*outDir, res, table); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		fmt.Printf("\nWrote results.md, throughput.svg and p99.svg to %s.\n", *outDir)
	}
}

func writeOut(dir string, res results, table string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(table), 0o644); err != nil {
		return err
	}
	tp, p99 := charts(res.rows, res.cfg.systems)
	for name, c := range map[string]chart{"throughput.svg": tp, "p99.svg": p99} {
		var b strings.Builder
		if err := c.write(&b); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

type config struct {
	concs     []int
	systems   []string
	duration  time.Duration
	bodies    bodies
	pgDSN     string
	redisAddr string
	rounds    int // runs of each cell
	wear      wearFlags
	drain     time.Duration // -drain
}

func (c config) maxConc() int { return slices.Max(c.concs) }

// check reports a system that needs a server the flags do not name.
func (c config) check() error {
	var errs []error
	for _, name := range []string{"postgres", "postgres-days", "pgstore", "proxy-pg-1", "proxy-pg-2", "proxy-pg-3"} {
		if slices.Contains(c.systems, name) && c.pgDSN == "" {
			errs = append(errs, fmt.Errorf("the %s system needs -pg DSN (bench/run.sh starts a server and passes it)", name))
		}
	}
	if slices.Contains(c.systems, "redis") && c.redisAddr == "" {
		errs = append(errs, errors.New("the redis system needs -redis ADDR (bench/run.sh starts a server and passes it)"))
	}
	return errors.Join(errs...)
}

func systemNames() []string {
	names := make([]string, 0, len(openers))
	for n := range openers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func parseConfig(concList, systemList string) (config, error) {
	var c config
	for _, f := range strings.Split(concList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return c, fmt.Errorf("bad concurrency %q", f)
		}
		c.concs = append(c.concs, n)
	}
	for _, f := range strings.Split(systemList, ",") {
		name := strings.TrimSpace(f)
		if _, ok := openers[name]; !ok {
			return c, fmt.Errorf("unknown system %q (have %s)", name, strings.Join(systemNames(), ", "))
		}
		if !slices.Contains(c.systems, name) {
			c.systems = append(c.systems, name)
		}
	}
	return c, nil
}

// row is one measurement.
type row struct {
	workload   string
	conc       int
	system     string
	ops        int
	elapsed    time.Duration
	p50, p99   time.Duration
	syncsPerOp float64
	wear       *cellWear // bytes written, in claim+complete cells
	lo, hi     float64   // ops/s of the cell's slowest and fastest run
}

// cellWear is what a claim+complete cell wrote.
type cellWear struct {
	dev        float64 // bytes the device wrote per operation, background subtracted
	background float64 // the background subtracted, per operation
	noDev      string  // why there is no dev figure, as the table shows it
	own        float64 // bytes the system counts it wrote per operation
	ownOK      bool
	quiet      bool // the drains before and after the cell fell quiet
}

func (r row) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

func run(ctx context.Context, cfg config, dataDir string) (results, error) {
	res := results{cfg: cfg}
	root, err := os.MkdirTemp(dataDir, "idem-bench-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(root)
	systems := map[string]system{}
	envs := map[string]env{}
	done := map[string]*opLog{}
	for _, name := range cfg.systems {
		e := env{
			dir: filepath.Join(root, name), maxConc: cfg.maxConc(), bodies: cfg.bodies,
			pgDSN: cfg.pgDSN, redisAddr: cfg.redisAddr,
		}
		s, err := openers[name](e)
		if err != nil {
			return res, fmt.Errorf("open %s: %w", name, err)
		}
		defer s.close()
		systems[name], envs[name], done[name] = s, e, &opLog{}
	}
	host := device.Local()
	wear := newWearSources(ctx, host, cfg, systems, envs)
	// Interleave: every system runs each cell before the next cell starts,
	// so slow drift of the machine hits them all alike. Runs of the same
	// cell vary by 10-15% on a shared disk, more than some goals' margins,
	// and the first replay cells meet the compactions that every store's
	// writes left behind; so the cells run in rounds, and the table shows
	// each cell's median run.
	type cell struct {
		workload string
		conc     int
		system   string
	}
	runs := map[cell][]row{}
	var cells []cell // in the table's order
	rounds := func(workloads []string, one func(c cell) (row, error)) error {
		for range cfg.rounds {
			for _, w := range workloads {
				for _, conc := range cfg.concs {
					for _, name := range cfg.systems {
						c := cell{w, conc, name}
						if _, ok := systems[name].(noReplay); ok && w != workClaim {
							continue
						}
						r, err := one(c)
						if err != nil {
							return fmt.Errorf("%s %s: %w", name, w, err)
						}
						r.workload, r.system = w, name
						if len(runs[c]) == 0 {
							cells = append(cells, c)
						}
						runs[c] = append(runs[c], r)
					}
				}
			}
		}
		return nil
	}
	err = rounds([]string{workClaim}, func(c cell) (row, error) {
		s, log := systems[c.system], done[c.system]
		if cs, ok := s.(cellStarter); ok {
			cs.startCell(c.conc)
		}
		w := wear[c.system]
		before, err := w.begin(ctx, host, cfg.drain, min(cfg.duration, maxBackgroundWindow))
		if err != nil {
			return row{}, fmt.Errorf("drain: %w", err)
		}
		s.syncsPerOp() // start counting here
		r, err := measure(ctx, c.conc, cfg.duration, func(rng *rand.Rand) error {
			o := newOp(rng.IntN(100))
			if err := s.claimComplete(ctx, o, cfg.bodies.of(o.key)); err != nil {
				return err
			}
			log.add(o)
			return nil
		})
		if err != nil {
			return r, err
		}
		r.syncsPerOp = s.syncsPerOp()
		after, err := w.end(ctx, host, cfg.drain)
		if err != nil {
			return row{}, fmt.Errorf("drain: %w", err)
		}
		cw := cellWearOf(before, after, r.ops)
		cw.noDev = w.noDev // set only when there is no device, whose readings are then zero
		r.wear = &cw
		return r, nil
	})
	if err != nil {
		return res, err
	}
	completed := map[string][]op{}
	for name, log := range done {
		completed[name] = log.all()
	}
	res.settled = append(res.settled, settle(settleLimit(cfg.duration)))
	err = rounds([]string{workReplay, workReplayAll}, func(c cell) (row, error) {
		s, ops := systems[c.system], completed[c.system]
		if c.workload == workReplay {
			ops = ops[max(0, len(ops)-recentKeys):]
		}
		return measure(ctx, c.conc, cfg.duration, func(rng *rand.Rand) error {
			o := ops[rng.IntN(len(ops))]
			body, err := s.replay(ctx, o)
			if err == nil && !bytes.Equal(body, cfg.bodies.of(o.key)) {
				err = fmt.Errorf("replayed %d bytes that are not the %d stored", len(body), cfg.bodies.n)
			}
			return err
		})
	})
	if err != nil {
		return res, err
	}
	for _, c := range cells {
		res.rows = append(res.rows, median(runs[c]))
	}
	if slices.Contains(cfg.systems, "idem-http") {
		d := min(cfg.duration, time.Second)
		res.settled = append(res.settled, settle(settleLimit(cfg.duration)))
		var all []overhead
		for range cfg.rounds {
			bare, wrapped, err := middlewareOverhead(d)
			if err != nil {
				return res, fmt.Errorf("middleware overhead: %w", err)
			}
			all = append(all, overhead{bare: bare, wrapped: wrapped})
		}
		// The median, and of an even count the larger middle one, so that
		// an even -rounds errs against the goal as median() does.
		slices.SortFunc(all, func(a, b overhead) int { return cmp.Compare(a.perRequest(), b.perRequest()) })
		res.overhead = &all[len(all)/2]
	}
	return res, nil
}

// median returns the run with the median throughput, its lo and hi set to
// the slowest and fastest runs' throughput; of an even count, the slower
// of the middle two.
func median(runs []row) row {
	slices.SortFunc(runs, func(a, b row) int { return cmp.Compare(a.rate(), b.rate()) })
	m := runs[(len(runs)-1)/2]
	m.lo, m.hi = runs[0].rate(), runs[len(runs)-1].rate()
	return m
}

// recentKeys is how many of the keys a system completed last the replay
// workload picks from. A client retries soon after its first attempt, so
// the records most retries ask for were written moments ago; replay-all
// shows the other end, a retry of any key the run stored.
const recentKeys = 10000

// opLog collects completed operations, in order, for the replay workloads.
type opLog struct {
	mu  sync.Mutex
	ops []op
}

func (l *opLog) add(o op) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, o)
}

func (l *opLog) all() []op {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ops)
}

// measure runs fn from conc goroutines for d and reports throughput and
// latency percentiles.
func measure(ctx context.Context, conc int, d time.Duration, fn func(*rand.Rand) error) (row, error) {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		lat      []time.Duration
	)
	start := time.Now()
	deadline := start.Add(d)
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(start.UnixNano())))
			local := make([]time.Duration, 0, 1024)
			for {
				t0 := time.Now()
				if !t0.Before(deadline) {
					break
				}
				if err := fn(rng); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					break
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return row{}, firstErr
	}
	if len(lat) == 0 {
		return row{}, fmt.Errorf("no operation finished in %s", d)
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return row{conc: conc, ops: len(lat), elapsed: elapsed, p50: pct(0.50), p99: pct(0.99)}, nil
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
