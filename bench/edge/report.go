package main

import (
	"cmp"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
)

// build says whether this binary uses cgo, which decides where Pebble's
// cache lives: C's allocator, or the Go heap.
func build() string {
	cgo := "?"
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "CGO_ENABLED" {
				cgo = s.Value
			}
		}
	}
	return "CGO_ENABLED=" + cgo + ", GOMEMLIMIT=" + cmp.Or(os.Getenv("GOMEMLIMIT"), "budget+16MiB under a budget")
}

func budgetName(b int64) string {
	if b == 0 {
		return "default"
	}
	return fmt.Sprintf("%d MiB", b)
}

func mib(n int64) string {
	if n < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// median returns the run with the median throughput.
func median(runs []result) result {
	s := slices.Clone(runs)
	slices.SortFunc(s, func(a, b result) int {
		switch {
		case a.OpsPerSec < b.OpsPerSec:
			return -1
		case a.OpsPerSec > b.OpsPerSec:
			return 1
		}
		return 0
	})
	return s[len(s)/2]
}

// curveTable is the Markdown table of a curve run. Throughput ratios are
// against the default sizing when it ran, else against the first budget.
func curveTable(c config, budgets []int64, runs map[int64][]result) string {
	base := budgets[0]
	if slices.Contains(budgets, 0) {
		base = 0
	}
	baseOps := median(runs[base]).OpsPerSec
	var b strings.Builder
	fmt.Fprintf(&b, "%d claim+complete, %d-byte bodies, %d callers, each synced; median of %d run(s); %s\n\n", c.Records, c.Body, c.Conc, len(runs[base]), build())
	b.WriteString("| budget | peak RSS | Go heap | ops/s | vs " + budgetName(base) + " | written B/op | log | zeros | tables | blobs | device B/op | records B/op | syncs/op | disk, empty | disk, all expired |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, bg := range budgets {
		r := median(runs[bg])
		dev := "n/a"
		if r.DeviceBytes >= 0 {
			dev = fmt.Sprintf("%.0f", float64(r.DeviceBytes)/float64(c.Records))
		}
		w := r.Written
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f | %.2fx | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %.0f | %.2f | %s | %s |\n", budgetName(bg), mib(r.PeakRSS), mib(r.GoHeap), r.OpsPerSec, r.OpsPerSec/baseOps,
			r.WrittenPerOp, w.Log, w.Zeros, w.Tables, w.Blobs, dev, r.LogicalPerOp, r.SyncsPerOp, mib(r.EmptyFloor), mib(r.ExpiredFloor))
	}
	return b.String()
}

// soakTable is the Markdown table of a soak: resident memory over time.
func soakTable(runs map[int64][]result) string {
	var b strings.Builder
	b.WriteString("| budget | ops/s | swept | resident memory, one sample per interval |\n|---|---:|---:|---|\n")
	budgets := slices.Sorted(func(yield func(int64) bool) {
		for k := range runs {
			if !yield(k) {
				return
			}
		}
	})
	for _, bg := range budgets {
		for _, r := range runs[bg] {
			var samples []string
			for _, s := range r.RSS {
				samples = append(samples, fmt.Sprintf("%.1f", float64(s)/(1<<20)))
			}
			fmt.Fprintf(&b, "| %s | %.0f | %d | %s MiB |\n", budgetName(bg), r.OpsPerSec, r.Swept, strings.Join(samples, " "))
		}
	}
	return b.String()
}
