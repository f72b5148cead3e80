package main

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleRows() []row {
	var rows []row
	for i, sys := range []string{"idem", "redis", "disk", `a<b&"c"`} {
		for _, conc := range []int{1, 16, 64} {
			rows = append(rows, row{workload: workClaim, system: sys, conc: conc, ops: 1000 * conc * (i + 1),
				elapsed: time.Second, p50: time.Duration(conc) * time.Millisecond, p99: time.Duration(conc*3) * time.Millisecond})
			if sys != "disk" {
				rows = append(rows, row{workload: workReplay, system: sys, conc: conc, ops: 50000 * (i + 1),
					elapsed: time.Second, p50: 10 * time.Microsecond, p99: time.Duration(conc) * 100 * time.Microsecond})
			}
		}
	}
	return rows
}

// svgPaths parses doc as XML and returns, per panel, the systems of its
// series paths in order.
func svgPaths(t *testing.T, doc string) map[string][]string {
	t.Helper()
	paths := map[string][]string{}
	dec := xml.NewDecoder(strings.NewReader(doc))
	panel, root := "", ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the SVG must be well-formed XML")
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = se.Name.Space + " " + se.Name.Local
		}
		attr := func(name string) string {
			for _, a := range se.Attr {
				if a.Name.Local == name {
					return a.Value
				}
			}
			return ""
		}
		switch {
		case se.Name.Local == "g" && attr("class") == "panel":
			panel = attr("data-workload")
		case se.Name.Local == "path" && attr("class") == "series":
			assert.True(t, strings.HasPrefix(attr("d"), "M"), "a path starts with a move")
			paths[panel] = append(paths[panel], attr("data-system"))
		}
	}
	assert.Equal(t, "http://www.w3.org/2000/svg svg", root)
	return paths
}

func TestChartsWellFormedOnePathPerSystem(t *testing.T) {
	systems := []string{"idem", "redis", "disk", `a<b&"c"`}
	tp, p99 := charts(sampleRows(), systems)
	for _, c := range []chart{tp, p99} {
		var b strings.Builder
		require.NoError(t, c.write(&b))
		paths := svgPaths(t, b.String())
		assert.Equal(t, map[string][]string{
			workClaim:  systems,
			workReplay: {"idem", "redis", `a<b&"c"`}, // disk has no replay
		}, paths)
	}
}

func TestChartsOneLevel(t *testing.T) {
	// A single concurrency level and a single system still make a chart.
	rows := []row{{workload: workClaim, system: "idem", conc: 8, ops: 100, elapsed: time.Second, p99: time.Millisecond}}
	tp, _ := charts(rows, []string{"idem"})
	var b strings.Builder
	require.NoError(t, tp.write(&b))
	assert.Equal(t, map[string][]string{workClaim: {"idem"}}, svgPaths(t, b.String()))
}

func TestGoalsOnlyWithTheirBaselines(t *testing.T) {
	res := results{rows: sampleRows(), cfg: config{systems: []string{"idem", "disk"}, concs: []int{1, 16, 64}, duration: time.Second}}
	var names []string
	for _, g := range goals(res) {
		names = append(names, g.goal)
	}
	// redis rows exist in the sample, so its goal shows; postgres was
	// never measured, so neither does its goal nor the middleware's.
	assert.Len(t, names, 4)
	for _, n := range names {
		assert.NotContains(t, n, "postgres")
		assert.NotContains(t, n, "middleware")
	}
	md := markdown(res)
	assert.Contains(t, md, "vs disk ceiling")
	assert.NotContains(t, md, "vs postgres")
}

func TestMedianRun(t *testing.T) {
	run := func(ops int) row { return row{ops: ops, elapsed: time.Second, p50: time.Duration(ops)} }
	m := median([]row{run(300), run(100), run(200)})
	assert.Equal(t, 200.0, m.rate())
	assert.Equal(t, time.Duration(200), m.p50, "the median run's own latencies go with it")
	assert.Equal(t, [2]float64{100, 300}, [2]float64{m.lo, m.hi})

	m = median([]row{run(400), run(100), run(300), run(200)})
	assert.Equal(t, 200.0, m.rate(), "of an even count, the slower middle run")

	m = median([]row{run(50)})
	assert.Equal(t, [3]float64{50, 50, 50}, [3]float64{m.rate(), m.lo, m.hi})
}

func TestMarkdownShowsTheRunsOfARoundedCell(t *testing.T) {
	rows := []row{
		{workload: workClaim, system: "idem", conc: 64, ops: 200, elapsed: time.Second, lo: 100, hi: 300},
		{workload: workReplay, system: "idem", conc: 64, ops: 900, elapsed: time.Second},
	}
	md := markdown(results{rows: rows, cfg: config{systems: []string{"idem"}, concs: []int{64}, duration: time.Second, rounds: 3}})
	assert.Contains(t, md, "| claim+complete | 64 | idem | 200 | 100–300 |")
	assert.Contains(t, md, "| replay | 64 | idem | 900 |  |")
	assert.Contains(t, md, "ran 3 times")

	md = markdown(results{rows: rows[:1], cfg: config{systems: []string{"idem"}, concs: []int{64}, duration: time.Second, rounds: 1}})
	assert.NotContains(t, md, "runs")
	assert.Contains(t, md, "| claim+complete | 64 | idem | 200 | ")
}
