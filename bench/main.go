// Command bench measures idem against baselines on this machine, in one
// run, interleaved, so that every ratio it prints compares figures taken
// under the same conditions.
//
//	go run ./bench [-duration 3s] [-conc 1,16,64] [-systems idem,pebble,pebble-tuned] [-out DIR]
//
// Workloads: "claim+complete" is one durable claim followed by one durable
// completion with a 1 KiB body, on fresh UUIDv4 keys spread over 100
// tenants; "replay" answers retries of keys completed earlier. Stores live
// in a temporary directory beside the current one (not /tmp, which may be
// memory), removed at the end.
package main

import (
	"context"
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
)

func main() {
	duration := flag.Duration("duration", 3*time.Second, "how long each measurement runs")
	concList := flag.String("conc", "1,16,64", "comma-separated concurrency levels")
	systemList := flag.String("systems", "idem,pebble,pebble-tuned", "comma-separated systems to measure: "+strings.Join(systemNames(), ", "))
	bodySize := flag.Int("body", 1024, "response body size in bytes")
	outDir := flag.String("out", "", "directory to write results.md into (default: print only)")
	dataDir := flag.String("data", ".", "directory under which the temporary stores are created")
	flag.Parse()

	cfg, err := parseConfig(*concList, *systemList)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		flag.Usage()
		os.Exit(2)
	}
	cfg.duration, cfg.body = *duration, make([]byte, *bodySize)
	rows, err := run(context.Background(), cfg, *dataDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	table := markdown(rows, cfg)
	fmt.Print(table)
	if *outDir != "" {
		if err := os.MkdirAll(*outDir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		if err := os.WriteFile(filepath.Join(*outDir, "results.md"), []byte(table), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
}

type config struct {
	concs    []int
	systems  []string
	duration time.Duration
	body     []byte
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
		c.systems = append(c.systems, name)
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
}

func (r row) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

func run(ctx context.Context, cfg config, dataDir string) ([]row, error) {
	root, err := os.MkdirTemp(dataDir, "idem-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	systems := map[string]system{}
	done := map[string]*opLog{}
	for _, name := range cfg.systems {
		s, err := openers[name](filepath.Join(root, name))
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", name, err)
		}
		defer s.close()
		systems[name], done[name] = s, &opLog{}
	}
	var rows []row
	// Interleave: every system runs each cell before the next cell starts,
	// so slow drift of the machine hits them all alike.
	for _, conc := range cfg.concs {
		for _, name := range cfg.systems {
			s, log := systems[name], done[name]
			s.syncsPerOp() // start counting here
			r, err := measure(ctx, conc, cfg.duration, func(rng *rand.Rand) error {
				o := newOp(rng.IntN(100))
				if err := s.claimComplete(ctx, o, cfg.body); err != nil {
					return err
				}
				log.add(o)
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("%s claim+complete: %w", name, err)
			}
			r.workload, r.system, r.syncsPerOp = "claim+complete", name, s.syncsPerOp()
			rows = append(rows, r)
		}
	}
	for _, conc := range cfg.concs {
		for _, name := range cfg.systems {
			s, ops := systems[name], done[name].all()
			r, err := measure(ctx, conc, cfg.duration, func(rng *rand.Rand) error {
				body, err := s.replay(ctx, ops[rng.IntN(len(ops))])
				if err == nil && len(body) != len(cfg.body) {
					err = fmt.Errorf("replayed %d bytes, stored %d", len(body), len(cfg.body))
				}
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("%s replay: %w", name, err)
			}
			r.workload, r.system = "replay", name
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// opLog collects completed operations for the replay workload.
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

// markdown renders the rows as a table, each with its ratios to the
// pebble baselines measured in the same cell.
func markdown(rows []row, cfg config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| workload | conc | system | ops/s | p50 | p99 | syncs/op | ops/s vs pebble | ops/s vs pebble-tuned | p50 vs pebble-tuned |\n")
	fmt.Fprintf(&b, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	base := map[string]row{}
	for _, r := range rows {
		base[fmt.Sprint(r.system, r.workload, r.conc)] = r
	}
	ratio := func(r row, system string, latency bool) string {
		br, ok := base[fmt.Sprint(system, r.workload, r.conc)]
		switch {
		case !ok:
			return ""
		case latency:
			return fmt.Sprintf("%.2fx", float64(r.p50)/float64(br.p50))
		default:
			return fmt.Sprintf("%.2fx", r.rate()/br.rate())
		}
	}
	for _, r := range rows {
		syncs := ""
		if r.syncsPerOp > 0 {
			syncs = fmt.Sprintf("%.3f", r.syncsPerOp)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %.0f | %s | %s | %s | %s | %s | %s |\n",
			r.workload, r.conc, r.system, r.rate(), round(r.p50), round(r.p99), syncs,
			ratio(r, "pebble", false), ratio(r, "pebble-tuned", false), ratio(r, "pebble-tuned", true))
	}
	fmt.Fprintf(&b, "\n%s per cell, %d-byte bodies, GOMAXPROCS=%d.\n", cfg.duration, len(cfg.body), runtimeProcs())
	return b.String()
}

func round(d time.Duration) string {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(100 * time.Nanosecond).String()
	}
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
