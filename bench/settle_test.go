package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCPULine(t *testing.T) {
	c, err := parseCPULine("cpu  100 5 50 800 40 3 2 0 7 1\n")
	require.NoError(t, err)
	// Idle (800) and iowait (40) are the time not busy; guest times (7, 1)
	// are already in user and nice.
	assert.Equal(t, cpuTimes{busy: 160, total: 1000}, c)
	later, err := parseCPULine("cpu  130 5 60 860 40 3 2 0 0 0\n")
	require.NoError(t, err)
	assert.InDelta(t, 0.4, later.busyShareSince(c), 1e-9)
	assert.Zero(t, c.busyShareSince(later), "no time passed, nothing was busy")

	for _, bad := range []string{"", "cpu0 1 2 3 4 5", "cpu 1 2 x 4 5", "intr 1 2 3 4 5"} {
		_, err := parseCPULine(bad)
		assert.Error(t, err, "%q", bad)
	}
}
