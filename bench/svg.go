package main

import (
	"cmp"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// chart is one SVG file: a panel per workload, side by side, each with a
// line per system over the concurrency levels, on log scales.
type chart struct {
	title  string // above the panels
	yLabel string
	panels []panel
	// format prints a value on the y axis.
	format func(float64) string
}

type panel struct {
	title  string
	series []series
}

type series struct {
	system string
	points []point // by increasing x
}

type point struct{ x, y float64 }

// palette gives each system one colour in every chart, so the two files
// read alike.
var palette = map[string]string{
	"idem":          "#1f77b4",
	"idem-http":     "#17becf",
	"pebble":        "#7f7f7f",
	"pebble-tuned":  "#bcbd22",
	"postgres":      "#2ca02c",
	"pgstore":       "#98df8a",
	"postgres-days": "#8c564b",
	"redis":         "#d62728",
	"disk":          "#000000",
}

// charts builds the throughput and p99 charts from the rows.
func charts(rows []row, systems []string) (throughput, p99 chart) {
	throughput = chart{title: "Throughput vs concurrency (higher is better)", yLabel: "ops/s", format: formatCount}
	p99 = chart{title: "p99 latency vs concurrency (lower is better)", yLabel: "p99 latency", format: formatSeconds}
	for _, w := range []string{workClaim, workReplay, workReplayAll} {
		tp, lp := panel{title: w}, panel{title: w}
		for _, sys := range systems {
			var ts, ls series
			ts.system, ls.system = sys, sys
			for _, r := range rows {
				if r.workload == w && r.system == sys {
					ts.points = append(ts.points, point{float64(r.conc), r.rate()})
					ls.points = append(ls.points, point{float64(r.conc), r.p99.Seconds()})
				}
			}
			if len(ts.points) > 0 {
				byX := func(a, b point) int { return cmp.Compare(a.x, b.x) }
				slices.SortFunc(ts.points, byX)
				slices.SortFunc(ls.points, byX)
				tp.series, lp.series = append(tp.series, ts), append(lp.series, ls)
			}
		}
		if len(tp.series) > 0 {
			throughput.panels, p99.panels = append(throughput.panels, tp), append(p99.panels, lp)
		}
	}
	return throughput, p99
}

func formatCount(v float64) string {
	switch {
	case v >= 1e6:
		return trimFloat(v/1e6) + "M"
	case v >= 1e3:
		return trimFloat(v/1e3) + "k"
	default:
		return trimFloat(v)
	}
}

func formatSeconds(v float64) string {
	return time.Duration(v * float64(time.Second)).String()
}

func trimFloat(v float64) string { return strings.TrimSuffix(fmt.Sprintf("%.3g", v), ".0") }

// Layout, in SVG user units.
const (
	panelW, panelH = 460, 340
	marginL        = 70
	marginR        = 20
	marginT        = 60
	marginB        = 50
	legendH        = 30
)

// write renders the chart as a standalone SVG document: text only, no
// scripts, no external references.
func (c chart) write(w io.Writer) error {
	width := len(c.panels)*(panelW+marginL+marginR) + 10
	height := marginT + panelH + marginB + legendH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="16" font-weight="bold">%s</text>`+"\n", 10, esc(c.title))
	var systems []string
	for i, p := range c.panels {
		c.writePanel(&b, p, i*(panelW+marginL+marginR)+marginL)
		for _, s := range p.series {
			if !slices.Contains(systems, s.system) {
				systems = append(systems, s.system)
			}
		}
	}
	// One legend for all panels: each system has one colour throughout.
	x, y := marginL, marginT+panelH+marginB+legendH/2
	for _, sys := range systems {
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", x, y, x+20, y, colour(sys))
		fmt.Fprintf(&b, `<text x="%d" y="%d" dominant-baseline="middle">%s</text>`+"\n", x+25, y, esc(sys))
		x += 40 + 8*len(sys)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (c chart) writePanel(b *strings.Builder, p panel, left int) {
	top := marginT
	xs, ys := []float64{}, []float64{}
	for _, s := range p.series {
		for _, pt := range s.points {
			xs = append(xs, pt.x)
			if pt.y > 0 {
				ys = append(ys, pt.y)
			}
		}
	}
	if len(xs) == 0 || len(ys) == 0 {
		return
	}
	// Log scales on both axes: concurrency levels are powers-ish of two,
	// and the systems differ by orders of magnitude.
	xMin, xMax := slices.Min(xs), slices.Max(xs)
	if xMax == xMin {
		xMin, xMax = xMin/2, xMax*2
	}
	yMin := math.Pow(10, math.Floor(math.Log10(slices.Min(ys))))
	yMax := math.Pow(10, math.Ceil(math.Log10(slices.Max(ys))))
	if yMax == yMin {
		yMax *= 10
	}
	px := func(x float64) float64 {
		return float64(left) + (math.Log(x)-math.Log(xMin))/(math.Log(xMax)-math.Log(xMin))*panelW
	}
	py := func(y float64) float64 {
		return float64(top) + panelH - (math.Log(y)-math.Log(yMin))/(math.Log(yMax)-math.Log(yMin))*panelH
	}
	fmt.Fprintf(b, `<g class="panel" data-workload="%s">`+"\n", esc(p.title))
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="14" text-anchor="middle">%s</text>`+"\n", left+panelW/2, top-10, esc(p.title))
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", left, top, panelW, panelH)
	// y grid: each decade, with 2 and 5 between when there are few decades.
	decades := math.Log10(yMax / yMin)
	for e := math.Log10(yMin); e <= math.Log10(yMax)+1e-9; e++ {
		for _, m := range []float64{1, 2, 5} {
			if m != 1 && decades > 3 {
				continue
			}
			v := m * math.Pow(10, e)
			if v > yMax*1.0001 {
				break
			}
			y := py(v)
			fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, left+panelW, y)
			fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-5, y, esc(c.format(v)))
		}
	}
	// x ticks at the measured levels.
	for _, x := range uniq(xs) {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", px(x), top, px(x), top+panelH)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px(x), top+panelH+16, trimFloat(x))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">concurrency (log scale)</text>`+"\n", left+panelW/2, top+panelH+36)
	fmt.Fprintf(b, `<text transform="translate(%d %d) rotate(-90)" text-anchor="middle">%s (log scale)</text>`+"\n", left-55, top+panelH/2, esc(c.yLabel))
	for _, s := range p.series {
		var d strings.Builder
		for _, pt := range s.points {
			if pt.y <= 0 {
				continue
			}
			cmd := "L"
			if d.Len() == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f ", cmd, px(pt.x), py(pt.y))
		}
		col := colour(s.system)
		fmt.Fprintf(b, `<path class="series" data-system="%s" d="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", esc(s.system), strings.TrimSpace(d.String()), col)
		for _, pt := range s.points {
			if pt.y > 0 {
				fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s, conc=%s: %s</title></circle>`+"\n",
					px(pt.x), py(pt.y), col, esc(s.system), trimFloat(pt.x), esc(c.format(pt.y)))
			}
		}
	}
	b.WriteString("</g>\n")
}

func colour(system string) string {
	if c, ok := palette[system]; ok {
		return c
	}
	return "#9467bd"
}

func esc(s string) string { return html.EscapeString(s) }

func uniq(xs []float64) []float64 {
	out := slices.Clone(xs)
	slices.Sort(out)
	return slices.Compact(out)
}
