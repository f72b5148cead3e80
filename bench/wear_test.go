package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/bench/device"
)

func TestWaitQuiet(t *testing.T) {
	const busy = 2 * drainQuietBytes / device.SectorBytes // sectors in a busy tick
	readings := []uint64{0, busy, 2 * busy, 2*busy + 1, 2*busy + 1, 2*busy + 2, 9 * busy}
	next := func(rs []uint64) func() (uint64, error) {
		return func() (uint64, error) {
			n := rs[0]
			rs = rs[1:]
			return n, nil
		}
	}
	n, quiet, err := waitQuiet(next(readings), drainQuietBytes, func() bool { return false }, func() {})
	require.NoError(t, err)
	assert.True(t, quiet)
	assert.Equal(t, uint64(2*busy+2), n, "three quiet ticks after the busy ones")

	n, quiet, err = waitQuiet(next(readings), drainQuietBytes, func() bool { return true }, func() {})
	require.NoError(t, err)
	assert.False(t, quiet, "the limit passed before the device fell quiet")
	assert.Equal(t, uint64(0), n)

	// A device that writes busy sectors a tick of its own accord is quiet
	// at that rate.
	n, quiet, err = waitQuiet(next(readings), 2*drainQuietBytes, func() bool { return false }, func() {})
	require.NoError(t, err)
	assert.True(t, quiet)
	assert.Equal(t, uint64(2*busy+1), n)
}

func TestWearCells(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := wearReading{sectors: 100, at: t0, own: 1000, ownOK: true, quiet: true, background: 1024}
	b := wearReading{sectors: 140, at: t0.Add(2 * time.Second), own: 3000, ownOK: true, quiet: true}
	w := cellWearOf(a, b, 4)
	// 40 sectors less two seconds of 1 KiB/s background, over 4 operations.
	assert.Equal(t, cellWear{dev: (40*512 - 2048) / 4.0, background: 512, own: 500, ownOK: true, quiet: true}, w)
	b.quiet = false
	assert.False(t, cellWearOf(a, b, 4).quiet, "a drain that hit its limit marks the cell")
	a.background = 1 << 20
	assert.Zero(t, cellWearOf(a, b, 4).dev, "more background than writes is none")
	a.own = 5000
	assert.False(t, cellWearOf(a, b, 4).ownOK, "an own count that shrank (a rewritten AOF) has no figure")

	assert.Equal(t, "5120", (&cellWear{dev: 5120, quiet: true}).devCell())
	assert.Equal(t, "5120*", (&cellWear{dev: 5120}).devCell())
	assert.Equal(t, "n/a (tmpfs)", (&cellWear{noDev: "n/a (tmpfs)"}).devCell())
	assert.Equal(t, "", (*cellWear)(nil).devCell())
	assert.Equal(t, "", (&cellWear{own: 7}).ownCell())
	assert.Equal(t, "7", (&cellWear{own: 7, ownOK: true}).ownCell())
}
