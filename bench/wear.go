package main

import (
	"context"
	"errors"
	"time"

	"github.com/idemkv/idem/bench/device"
)

// The bytes-written/op figure is the block device's own count of sectors
// written (package device finds the device that holds a system's files
// and reads its counter) over a claim+complete cell, divided by the
// operations the cell completed. Whatever the system defers (Pebble's
// flushes and compactions, PostgreSQL's dirty pages, the page cache's
// writeback) would otherwise land in a later cell or after the run, so
// each cell ends with a drain: the system's own hook (a wait for Pebble's
// compactions, a CHECKPOINT), a sync of every filesystem, then a wait for
// the device to fall quiet. Only then is the counter read. The same drain
// runs before the cell, so that the last cell's tail is not counted twice.

const (
	drainTick    = 100 * time.Millisecond // one sample of the device's counter
	drainSamples = 3                      // quiet samples in a row
	// drainQuietBytes is the most a device may write in one tick and still
	// count as quiet: a journal commit or another process's trickle, not a
	// compaction or a checkpoint.
	drainQuietBytes = 256 << 10
	// maxBackgroundWindow bounds how long the devices are watched, with
	// the system idle, before each cell: as long as the cell, up to this.
	maxBackgroundWindow = time.Second
)

// wearSource is what a system writes to, as the harness counts it: the
// devices holding its files, and optionally its own count of bytes
// written and a hook that waits for the work it defers.
type wearSource struct {
	devs  []device.Device
	noDev string // the table's text when there is no device to count
	// own returns the system's own running count of bytes written, nil
	// when it keeps none the harness can read.
	own func(ctx context.Context) (uint64, error)
	// settle waits for, or forces, the writes the system defers; nil
	// when it defers none the harness can reach.
	settle func(ctx context.Context) error
	// background is the rate the last begin measured, in bytes per second.
	background float64
}

// wearReading is one reading of a wearSource.
type wearReading struct {
	sectors uint64
	at      time.Time
	own     uint64
	ownOK   bool
	quiet   bool // the drain before the reading fell quiet within its limit
	// background is the rate, in bytes per second, at which the devices
	// wrote while the system was idle, just before the cell; begin sets it.
	background float64
}

// begin drains what earlier cells left, then watches the devices for
// window while the system is idle, to learn what the rest of the machine
// writes, and returns the reading the cell starts from.
func (w *wearSource) begin(ctx context.Context, h device.Host, limit, window time.Duration) (wearReading, error) {
	r, err := w.drain(ctx, h, limit)
	if err != nil || len(w.devs) == 0 {
		return r, err
	}
	time.Sleep(window)
	n, err := w.sectors(h)
	if err != nil {
		return r, err
	}
	now := time.Now()
	r.background = float64(n-r.sectors) * device.SectorBytes / now.Sub(r.at).Seconds()
	r.sectors, r.at = n, now
	w.background = r.background
	if w.own != nil {
		r.own, err = w.own(ctx)
		r.ownOK = err == nil
	}
	return r, nil
}

// end drains what the cell left and returns the reading it ends at.
func (w *wearSource) end(ctx context.Context, h device.Host, limit time.Duration) (wearReading, error) {
	return w.drain(ctx, h, limit)
}

// drain runs the system's hook, syncs every filesystem and waits until
// the devices have fallen back to the background rate (plus
// drainQuietBytes per tick) for drainSamples ticks in a row, or limit
// passed, then reads the counters.
func (w *wearSource) drain(ctx context.Context, h device.Host, limit time.Duration) (wearReading, error) {
	start := time.Now()
	r := wearReading{quiet: true}
	if w.settle != nil {
		sctx, cancel := context.WithTimeout(ctx, limit)
		err := w.settle(sctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			r.quiet = false
		} else if err != nil {
			return r, err
		}
	}
	if len(w.devs) > 0 {
		device.SyncAll()
		read := func() (uint64, error) { return w.sectors(h) }
		quietBytes := drainQuietBytes + uint64(2*w.background*drainTick.Seconds())
		n, fell, err := waitQuiet(read, quietBytes, func() bool { return time.Since(start) >= limit }, func() { time.Sleep(drainTick) })
		if err != nil {
			return r, err
		}
		r.sectors, r.quiet = n, r.quiet && fell
	}
	r.at = time.Now()
	if w.own != nil {
		n, err := w.own(ctx)
		r.own, r.ownOK = n, err == nil
	}
	return r, nil
}

func (w *wearSource) sectors(h device.Host) (uint64, error) {
	var sum uint64
	for _, d := range w.devs {
		n, err := h.SectorsWritten(d)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// waitQuiet reads the counter every tick until it grew by at most
// quietBytes per tick drainSamples times in a row, or expired reports
// true, and returns the last reading and whether it was quiet.
func waitQuiet(read func() (uint64, error), quietBytes uint64, expired func() bool, tick func()) (uint64, bool, error) {
	prev, err := read()
	if err != nil {
		return 0, false, err
	}
	for quiet := 0; quiet < drainSamples; {
		if expired() {
			return prev, false, nil
		}
		tick()
		cur, err := read()
		if err != nil {
			return 0, false, err
		}
		if (cur-prev)*device.SectorBytes <= quietBytes {
			quiet++
		} else {
			quiet = 0
		}
		prev = cur
	}
	return prev, true, nil
}

// cellWearOf is what a cell of ops operations wrote between readings a
// and b: the device's bytes less what the background rate measured before
// the cell accounts for over the same time, per operation.
func cellWearOf(a, b wearReading, ops int) cellWear {
	bg := a.background * b.at.Sub(a.at).Seconds()
	dev := float64(b.sectors-a.sectors) * device.SectorBytes
	w := cellWear{dev: max(0, dev-bg) / float64(ops), background: bg / float64(ops), quiet: a.quiet && b.quiet}
	if a.ownOK && b.ownOK && b.own >= a.own {
		w.own, w.ownOK = float64(b.own-a.own)/float64(ops), true
	}
	return w
}
