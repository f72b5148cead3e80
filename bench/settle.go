package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The claim rounds leave work behind: every embedded store compacts what
// it was written, the servers checkpoint. A replay or a middleware request
// only needs the processor, and on two cores another store's compaction
// took idem's replay from 355k/s, measured alone, to 100k/s in a full
// run. So before those phases the harness waits for the machine to fall
// quiet.
const (
	settleTick    = 100 * time.Millisecond // one sample of /proc/stat
	settleSamples = 3                      // quiet samples in a row
	settleBusy    = 0.10                   // busy share of all processors below which a sample is quiet
)

// settleLimit bounds a wait by the length of a cell: a minute in a full
// run, a few seconds in a smoke run.
func settleLimit(cell time.Duration) time.Duration { return min(time.Minute, 20*cell) }

// settled is what one settle saw.
type settled struct {
	waited time.Duration
	quiet  bool // false: the limit passed, or /proc/stat could not be read
}

// settle waits until the processors have been nearly idle for
// settleSamples ticks in a row, or limit passed. Where /proc/stat cannot
// be read it returns at once.
func settle(limit time.Duration) settled {
	start := time.Now()
	prev, err := readCPU()
	quiet := 0
	for err == nil && quiet < settleSamples && time.Since(start) < limit {
		time.Sleep(settleTick)
		var cur cpuTimes
		if cur, err = readCPU(); err != nil {
			break
		}
		if cur.busyShareSince(prev) < settleBusy {
			quiet++
		} else {
			quiet = 0
		}
		prev = cur
	}
	return settled{waited: time.Since(start), quiet: quiet == settleSamples}
}

func (s settled) String() string {
	d := s.waited.Round(100 * time.Millisecond)
	if s.quiet {
		return "waited " + d.String() + " for the machine to fall quiet"
	}
	return "gave up waiting for a quiet machine after " + d.String()
}

// cpuTimes is the first line of /proc/stat: time spent by all processors,
// in clock ticks.
type cpuTimes struct{ busy, total uint64 }

func (c cpuTimes) busyShareSince(prev cpuTimes) float64 {
	if c.total <= prev.total {
		return 0
	}
	return float64(c.busy-prev.busy) / float64(c.total-prev.total)
}

func readCPU() (cpuTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return cpuTimes{}, err
	}
	return parseCPULine(line)
}

// parseCPULine reads "cpu user nice system idle iowait irq softirq steal
// guest guest_nice": idle and iowait are the time not busy, and the guest
// times are already counted in user and nice.
func parseCPULine(line string) (cpuTimes, error) {
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("bench: unexpected /proc/stat line %q", line)
	}
	var c cpuTimes
	for i, f := range fields[1:min(len(fields), 9)] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("bench: unexpected /proc/stat line %q", line)
		}
		c.total += n
		if i != 3 && i != 4 {
			c.busy += n
		}
	}
	return c, nil
}
