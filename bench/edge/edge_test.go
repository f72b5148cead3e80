package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChildMeasures runs one budget for a few thousand records, as the
// parent's child process does, and checks that each figure was measured.
func TestChildMeasures(t *testing.T) {
	res, err := runChild(config{Budget: 4, Records: 3000, Conc: 8, Body: 300, Data: t.TempDir()})
	require.NoError(t, err)
	assert.Positive(t, res.OpsPerSec)
	assert.Positive(t, res.PeakRSS)
	assert.Positive(t, res.SyncsPerOp)
	assert.InDelta(t, 300+len("device")+len("POST /v1/payments")+25+32, res.LogicalPerOp, 1)
	assert.Greater(t, res.WrittenPerOp, res.LogicalPerOp, "the log alone holds every record")
	assert.Greater(t, res.Written.Log, res.LogicalPerOp/2, "records are in the log")
	assert.LessOrEqual(t, res.Written.Log+res.Written.Zeros+res.Written.Tables+res.Written.Blobs, res.WrittenPerOp)
	assert.Positive(t, res.EmptyFloor)
	assert.Positive(t, res.ExpiredFloor)
	assert.Less(t, res.ExpiredFloor, int64(4<<20), "a 4 MiB budget keeps small logs")

	table := curveTable(config{Records: 3000, Conc: 8, Body: 300}, []int64{4}, map[int64][]result{4: {res}})
	assert.Contains(t, table, "| 4 MiB |")
}

func TestSoakSamplesResidentMemory(t *testing.T) {
	res, err := runChild(config{Budget: 4, Conc: 4, Body: 100, Data: t.TempDir(),
		Soak: 1500 * time.Millisecond, SoakTTL: time.Second, Sample: 250 * time.Millisecond})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(res.RSS), 4)
	for _, r := range res.RSS {
		assert.Positive(t, r)
	}
	assert.Contains(t, soakTable(map[int64][]result{4: {res}}), "| 4 MiB |")
}

func TestParseBudgets(t *testing.T) {
	got, err := parseBudgets("8, 16,0")
	require.NoError(t, err)
	assert.Equal(t, []int64{8, 16, 0}, got)
	for _, bad := range []string{"", "x", "-1", "16MiB"} {
		_, err := parseBudgets(bad)
		assert.Error(t, err, bad)
	}
}
