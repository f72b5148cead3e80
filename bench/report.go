package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

const (
	workClaim     = "claim+complete"
	workReplay    = "replay"
	workReplayAll = "replay-all"
)

// baselines are the systems every other row is compared with, in the
// order of the table's ratio columns, with their column headings.
var baselines = []struct{ system, heading string }{
	{"redis", "vs redis"},
	{"postgres", "vs postgres"},
	{"disk", "vs disk ceiling"},
	{"pebble", "vs pebble"},
	{"proxy-pg-1", "vs proxy-pg-1"},
	{"upstream", "vs upstream"},
}

// results is everything one run measured.
type results struct {
	rows     []row
	cfg      config
	overhead *overhead // nil when the middleware was not measured
	// settled is what the waits for a quiet machine before the replays
	// and before the middleware saw, in that order.
	settled []settled
}

// overhead is the middleware's cost per request over a no-op handler.
type overhead struct{ bare, wrapped time.Duration }

func (o overhead) perRequest() time.Duration { return o.wrapped - o.bare }

// best returns system's fastest row in workload.
func (res results) best(workload, system string) (row, bool) {
	var b row
	for _, r := range res.rows {
		if r.workload == workload && r.system == system && (b.ops == 0 || r.rate() > b.rate()) {
			b = r
		}
	}
	return b, b.ops > 0
}

// find returns the row of system in workload at conc.
func (res results) find(workload, system string, conc int) (row, bool) {
	for _, r := range res.rows {
		if r.workload == workload && r.system == system && r.conc == conc {
			return r, true
		}
	}
	return row{}, false
}

// markdown renders the rows as a table, each with its throughput ratios to
// the baselines measured in the same run and cell, then the goals.
func markdown(res results) string {
	var present []int
	for i, bl := range baselines {
		if slices.Contains(res.cfg.systems, bl.system) {
			present = append(present, i)
		}
	}
	var b strings.Builder
	rounds := res.cfg.rounds > 1
	b.WriteString("| workload | conc | system | ops/s |")
	if rounds {
		b.WriteString(" runs |")
	}
	b.WriteString(" p50 | p99 | syncs/op | bytes-written/op | own bytes/op |")
	for _, i := range present {
		b.WriteString(" " + baselines[i].heading + " |")
	}
	b.WriteString("\n|---|---:|---|---:|" + strings.Repeat("---:|", 5+len(present)))
	if rounds {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, r := range res.rows {
		syncs := ""
		if r.syncsPerOp > 0 {
			syncs = fmt.Sprintf("%.3f", r.syncsPerOp)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %.0f |", r.workload, r.conc, r.system, r.rate())
		if rounds {
			spread := ""
			if r.hi > 0 {
				spread = fmt.Sprintf("%.0f–%.0f", r.lo, r.hi)
			}
			b.WriteString(" " + spread + " |")
		}
		fmt.Fprintf(&b, " %s | %s | %s | %s | %s |", round(r.p50), round(r.p99), syncs, r.wear.devCell(), r.wear.ownCell())
		for _, i := range present {
			cell := ""
			if br, ok := res.find(r.workload, baselines[i].system, r.conc); ok {
				cell = fmt.Sprintf("%.2fx", r.rate()/br.rate())
			}
			b.WriteString(" " + cell + " |")
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "\n%s per cell, %d-byte bodies, GOMAXPROCS=%d.", res.cfg.duration, res.cfg.bodies.n, runtimeProcs())
	if rounds {
		fmt.Fprintf(&b, " Each cell ran %d times, interleaved with the others; its row is the median run, and runs gives the slowest and fastest.", res.cfg.rounds)
	}
	if len(res.settled) > 0 {
		fmt.Fprintf(&b, " Before the replays the run %s", res.settled[0])
		if len(res.settled) > 1 {
			fmt.Fprintf(&b, ", and before the middleware it %s", res.settled[1])
		}
		b.WriteString(".")
	}
	if n := noisyCells(res.rows); n > 0 {
		fmt.Fprintf(&b, " A bytes-written/op marked * comes from a cell whose device did not fall quiet within -drain (%s) before or after it (%d of them), so it holds what was still being written.", res.cfg.drain, n)
	}
	if res.overhead != nil {
		fmt.Fprintf(&b, " Middleware, one request at a time on an in-memory store (the median of %d runs): no-op handler %s bare, %s behind idemhttp.",
			max(1, res.cfg.rounds), round(res.overhead.bare), round(res.overhead.wrapped))
	}
	b.WriteString("\n")
	b.WriteString(wearTable(res))
	if gs := goals(res); len(gs) > 0 {
		b.WriteString("\nGoals, from this run:\n\n| goal | measured | |\n|---|---|---|\n")
		for _, g := range gs {
			verdict := "not met"
			if g.met {
				verdict = "met"
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", g.goal, g.measured, verdict)
		}
	}
	return b.String()
}

// goal is one of the targets, as measured.
type goal struct {
	goal, measured string
	met            bool
}

// goals checks the targets whose figures, baselines included, this run
// measured, and leaves the others out.
func goals(res results) []goal {
	var gs []goal
	const high = 64
	idem64, ok := res.find(workClaim, "idem", high)
	if ok {
		for _, t := range []struct {
			system string
			min    float64
		}{{"redis", 2}, {"postgres", 6}, {"disk", 0.25}} {
			br, ok := res.find(workClaim, t.system, high)
			if !ok {
				continue
			}
			ratio := idem64.rate() / br.rate()
			gs = append(gs, goal{
				goal:     fmt.Sprintf("claim+complete at conc=%d: idem ≥ %gx %s", high, t.min, t.system),
				measured: fmt.Sprintf("%.2fx (%.0f vs %.0f ops/s)", ratio, idem64.rate(), br.rate()),
				met:      ratio >= t.min,
			})
		}
	}
	if best, ok := res.best(workReplay, "idem"); ok {
		measured := fmt.Sprintf("%.0f ops/s (best cell, conc=%d)", best.rate(), best.conc)
		if all, ok := res.best(workReplayAll, "idem"); ok {
			measured += fmt.Sprintf("; %s: %.0f ops/s (conc=%d)", workReplayAll, all.rate(), all.conc)
		}
		gs = append(gs, goal{
			goal:     "replay in process: idem ≥ 150000 ops/s",
			measured: measured,
			met:      best.rate() >= 150000,
		})
	}
	if o := res.overhead; o != nil {
		gs = append(gs, goal{
			goal:     "middleware overhead, no-op handler, store without sync: ≤ 15µs per request",
			measured: round(o.perRequest()),
			met:      o.perRequest() <= 15*time.Microsecond,
		})
	}
	// atLeast adds the goal that system reaches min times base's ops/s in
	// workload w at conc, when the run measured both.
	atLeast := func(w, system, base string, conc int, min float64) {
		got, ok1 := res.find(w, system, conc)
		ref, ok2 := res.find(w, base, conc)
		if !ok1 || !ok2 {
			return
		}
		ratio := got.rate() / ref.rate()
		gs = append(gs, goal{
			goal:     fmt.Sprintf("%s at conc=%d: %s ≥ %.1fx %s", w, conc, system, min, base),
			measured: fmt.Sprintf("%.2fx (%.0f vs %.0f ops/s)", ratio, got.rate(), ref.rate()),
			met:      ratio >= min,
		})
	}
	// pgstore is the reference's design plus the contract's work; that
	// work may cost at most a tenth of the raw row's throughput.
	for _, w := range []string{workClaim, workReplay} {
		for _, conc := range []int{16, 64} {
			atLeast(w, "pgstore", "postgres", conc, 0.9)
		}
	}
	// The proxy is idemhttp in a process of its own plus a hop to the
	// upstream; that hop may cost a fifth of the throughput under
	// concurrency, and 150µs of latency one request at a time.
	for _, conc := range []int{16, 64} {
		atLeast(workClaim, "idem-proxy", "idem-http", conc, 0.8)
	}
	if px, ok := res.find(workClaim, "idem-proxy", 1); ok {
		if ih, ok := res.find(workClaim, "idem-http", 1); ok {
			added := px.p50 - ih.p50
			gs = append(gs, goal{
				goal:     "claim+complete at conc=1: idem-proxy p50 ≤ idem-http p50 + 150µs",
				measured: fmt.Sprintf("%s added (%s vs %s)", round(added), round(px.p50), round(ih.p50)),
				met:      added <= 150*time.Microsecond,
			})
		}
	}
	idem1, ok1 := res.find(workClaim, "idem", 1)
	disk1, ok2 := res.find(workClaim, "disk", 1)
	if ok1 && ok2 {
		ratio := float64(idem1.p50) / float64(disk1.p50)
		gs = append(gs, goal{
			goal:     "claim+complete at conc=1: idem p50 ≤ 2.5x one fdatasync (disk p50 at conc=1)",
			measured: fmt.Sprintf("%.2fx (%s vs %s)", ratio, round(idem1.p50), round(disk1.p50)),
			met:      ratio <= 2.5,
		})
	}
	return gs
}

// devCell is the bytes-written/op column: the device's bytes per
// operation, or why there is no figure; empty outside claim+complete.
func (w *cellWear) devCell() string {
	switch {
	case w == nil:
		return ""
	case w.noDev != "":
		return w.noDev
	case !w.quiet:
		return fmt.Sprintf("%.0f*", w.dev)
	}
	return fmt.Sprintf("%.0f", w.dev)
}

// ownCell is the own bytes/op column: what the system counts it wrote.
func (w *cellWear) ownCell() string {
	if w == nil || !w.ownOK {
		return ""
	}
	return fmt.Sprintf("%.0f", w.own)
}

func noisyCells(rows []row) int {
	n := 0
	for _, r := range rows {
		if r.wear != nil && r.wear.noDev == "" && !r.wear.quiet {
			n++
		}
	}
	return n
}

// wearTable renders the claim+complete rows' bytes written with their
// ratios to idem's and disk's in the same cell, when the run counted a
// device for any of them.
func wearTable(res results) string {
	var rows []row
	for _, r := range res.rows {
		if r.workload == workClaim && r.wear != nil {
			rows = append(rows, r)
		}
	}
	if !slices.ContainsFunc(rows, func(r row) bool { return r.wear.noDev == "" }) {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nBytes written per claim+complete, from the device's own counters, less what the rest of the machine wrote at the rate measured before each cell (subtracted):\n\n")
	b.WriteString("| conc | system | bytes-written/op | subtracted | own bytes/op | vs idem | vs disk |\n|---:|---|---:|---:|---:|---:|---:|\n")
	ratio := func(r row, base string) string {
		br, ok := res.find(workClaim, base, r.conc)
		if !ok || br.wear == nil || br.wear.noDev != "" || r.wear.noDev != "" || br.wear.dev == 0 {
			return ""
		}
		return fmt.Sprintf("%.2fx", r.wear.dev/br.wear.dev)
	}
	for _, r := range rows {
		bg := ""
		if r.wear.noDev == "" {
			bg = fmt.Sprintf("%.0f", r.wear.background)
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s |\n", r.conc, r.system, r.wear.devCell(), bg, r.wear.ownCell(), ratio(r, "idem"), ratio(r, "disk"))
	}
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
