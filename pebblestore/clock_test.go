package pebblestore_test

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	fake "github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

// logLines returns a logger that writes text lines to buf.
func logLines(buf *bytes.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(buf, nil)) }

// TestClockBehindRefusesClaims steps the clock back past the tolerance and
// forward into it again: claims are refused while it is beyond, change
// nothing, are counted and logged once, and are accepted within it.
func TestClockBehindRefusesClaims(t *testing.T) {
	var logged bytes.Buffer
	db, clock := idemtest.Open(t, &pebblestore.Options{Logger: logLines(&logged), ClockTolerance: 5 * time.Second})
	require.NoError(t, claim(t, db, scope("done"), fp("a")).Complete(ctx, paid))
	before := collect(t, db, idem.Filter{})

	clock.Advance(-6 * time.Second)
	for _, key := range []string{"new", "new", "done"} {
		l, rec, err := db.Claim(ctx, scope(key), fp("a"))
		require.ErrorIs(t, err, idem.ErrClockBehind)
		assert.Contains(t, err.Error(), "6s behind")
		assert.Nil(t, l)
		assert.Nil(t, rec)
	}
	_, err := db.Get(ctx, scope("new"))
	require.ErrorIs(t, err, idem.ErrNotFound, "a refused claim stores nothing")
	assert.Equal(t, before, collect(t, db, idem.Filter{}))
	m, err := db.Metrics(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(3), m.Events[idem.EventClockBehind])
	assert.Equal(t, int64(1), m.Events[idem.EventClaimed])
	assert.Equal(t, 1, strings.Count(logged.String(), "claims are refused"), "one line per episode:\n%s", logged.String())
	assert.Contains(t, logged.String(), "behind=6s")

	clock.Advance(time.Second) // exactly the tolerance behind
	l := claim(t, db, scope("new"), fp("a"))
	require.NoError(t, l.Complete(ctx, paid))
	assert.Contains(t, logged.String(), "claims are accepted")
	pebblestore.RequireConsistent(t, db)
}

// TestClockMarkFollowsTheClock shows that the mark only moves forward: a
// claim well behind an earlier one is refused, and once the clock has
// passed the mark, the mark follows it.
func TestClockMarkFollowsTheClock(t *testing.T) {
	db, clock := idemtest.Open(t, &pebblestore.Options{Logger: discard()})
	clock.Advance(time.Hour)
	claim(t, db, scope("ahead"), fp("a"))
	clock.Advance(-time.Hour)
	_, _, err := db.Claim(ctx, scope("k"), fp("a"))
	require.ErrorIs(t, err, idem.ErrClockBehind)

	clock.Advance(time.Hour + time.Minute)
	claim(t, db, scope("k"), fp("a"))
	clock.Advance(-time.Minute)
	_, _, err = db.Claim(ctx, scope("k2"), fp("a"))
	require.ErrorIs(t, err, idem.ErrClockBehind, "the mark moved on with the clock")
}

// TestClockMarkWrittenOncePerSecond checks that the stored mark moves with
// the commits that move the clock on by a second or more, and only then.
func TestClockMarkWrittenOncePerSecond(t *testing.T) {
	db, clock := idemtest.Open(t, nil)
	_, ok, err := db.StoredClockMark()
	require.NoError(t, err)
	assert.False(t, ok, "a new store has no mark")

	start := clock.Now()
	claim(t, db, scope("k1"), fp("a"))
	mark, ok, err := db.StoredClockMark()
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, start.Equal(mark), "the first write stores the mark")

	clock.Advance(600 * time.Millisecond)
	claim(t, db, scope("k2"), fp("a"))
	mark, _, err = db.StoredClockMark()
	require.NoError(t, err)
	assert.True(t, start.Equal(mark), "less than a second on: not written again")

	clock.Advance(600 * time.Millisecond)
	claim(t, db, scope("k3"), fp("a"))
	mark, _, err = db.StoredClockMark()
	require.NoError(t, err)
	assert.True(t, clock.Now().Equal(mark), "a second on: written with the claim")
}

// TestClockMarkSurvivesReopen closes the store after a claim and opens it
// again with the clock an hour back: the mark is still there.
func TestClockMarkSurvivesReopen(t *testing.T) {
	fs := vfs.NewMem()
	clock := fake.NewClock()
	opts := pebblefs.With(&pebblestore.Options{Now: clock.Now, SweepInterval: -1, Logger: discard()}, fs)
	db, err := pebblestore.Open("db", opts)
	require.NoError(t, err)
	claim(t, db, scope("k"), fp("a"))
	require.NoError(t, db.Close())

	clock.Advance(-time.Hour)
	db, err = pebblestore.Open("db", opts)
	require.NoError(t, err)
	defer db.Close()
	_, _, err = db.Claim(ctx, scope("k2"), fp("a"))
	require.ErrorIs(t, err, idem.ErrClockBehind)
	clock.Advance(time.Hour)
	claim(t, db, scope("k2"), fp("a"))
}

// TestClockMarkSurvivesCrash takes a crash image right after a claim was
// acknowledged: the mark went to the log in the claim's own synced batch.
func TestClockMarkSurvivesCrash(t *testing.T) {
	fs := vfs.NewCrashableMem()
	clock := fake.NewClock()
	db, err := pebblestore.Open("db", pebblefs.With(&pebblestore.Options{Now: clock.Now, SweepInterval: -1, Logger: discard()}, fs))
	require.NoError(t, err)
	claim(t, db, scope("k"), fp("a"))
	image := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(1, 2))})
	require.NoError(t, db.Close())

	clock.Advance(-time.Hour)
	db, err = pebblestore.Open("db", pebblefs.With(&pebblestore.Options{Now: clock.Now, SweepInterval: -1, Logger: discard()}, image))
	require.NoError(t, err)
	defer db.Close()
	_, _, err = db.Claim(ctx, scope("k2"), fp("a"))
	require.ErrorIs(t, err, idem.ErrClockBehind)
	_, err = db.Get(ctx, scope("k2"))
	require.ErrorIs(t, err, idem.ErrNotFound)
	pebblestore.RequireConsistent(t, db)
}

// TestClockBehindLeaseAndOperator checks the other calls under a clock
// behind: a lease still stores its outcome and never shortens itself,
// TakeOver is refused like a claim, and a sweep deletes nothing early.
func TestClockBehindLeaseAndOperator(t *testing.T) {
	db, clock := idemtest.Open(t, &pebblestore.Options{Logger: discard(), TTL: time.Hour, Lease: time.Minute})
	l := claim(t, db, scope("running"), fp("a"))
	require.NoError(t, claim(t, db, scope("lost"), fp("a")).MarkUnknown(ctx))
	leaseEnd := l.Record().LeaseUntil

	clock.Advance(-10 * time.Minute)
	require.NoError(t, l.Extend(ctx))
	assert.Equal(t, leaseEnd, l.Record().LeaseUntil, "a clock behind never moves the lease's end back")
	_, err := db.TakeOver(ctx, scope("lost"))
	require.ErrorIs(t, err, idem.ErrClockBehind)
	rec, err := db.Get(ctx, scope("lost"))
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State, "a refused take-over changes nothing")
	assert.Equal(t, uint32(1), rec.Attempts)
	res, err := db.Sweep(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Records)
	require.NoError(t, l.Complete(ctx, paid), "the outcome of an operation that ran is stored")

	clock.Advance(10 * time.Minute)
	_, rec, err = db.Claim(ctx, scope("running"), fp("a"))
	require.NoError(t, err)
	require.NotNil(t, rec)
	assert.Equal(t, paid.Body, rec.Response.Body)
	pebblestore.RequireConsistent(t, db)
}

// TestSweepWarnsWhenClockPassesEverything jumps the clock past the TTL of
// everything written: the sweep deletes it all and says so once.
func TestSweepWarnsWhenClockPassesEverything(t *testing.T) {
	var logged bytes.Buffer
	db, clock := idemtest.Open(t, &pebblestore.Options{Logger: logLines(&logged), TTL: time.Hour, Lease: time.Minute})
	require.NoError(t, claim(t, db, scope("k"), fp("a")).Complete(ctx, paid))
	clock.Advance(30 * time.Minute)
	_, err := db.Sweep(ctx)
	require.NoError(t, err)
	assert.Empty(t, logged.String())

	clock.Advance(24 * time.Hour)
	for range 2 {
		_, err = db.Sweep(ctx)
		require.NoError(t, err)
	}
	assert.Equal(t, 1, strings.Count(logged.String(), "past the expiry of every record"), logged.String())
	m, err := db.Metrics(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), m.Events[idem.EventSwept])
}

// TestResetClockMark lowers a mark that a clock wrongly ahead left: claims
// are accepted at once, and the lowered mark is the one a reopened store
// finds.
func TestResetClockMark(t *testing.T) {
	fs := vfs.NewMem()
	clock := fake.NewClock()
	opts := pebblefs.With(&pebblestore.Options{Now: clock.Now, SweepInterval: -1, Logger: discard()}, fs)
	db, err := pebblestore.Open("db", opts)
	require.NoError(t, err)
	_, ok := db.ClockMark()
	assert.False(t, ok)
	clock.Advance(24 * time.Hour)
	claim(t, db, scope("ahead"), fp("a"))
	clock.Advance(-24 * time.Hour)
	_, _, err = db.Claim(ctx, scope("k"), fp("a"))
	require.ErrorIs(t, err, idem.ErrClockBehind)

	mark, err := db.ResetClockMark(ctx)
	require.NoError(t, err)
	assert.True(t, clock.Now().Equal(mark))
	got, ok := db.ClockMark()
	require.True(t, ok)
	assert.True(t, mark.Equal(got))
	require.NoError(t, db.Close())
	_, err = db.ResetClockMark(ctx)
	require.ErrorIs(t, err, idem.ErrClosed)

	db, err = pebblestore.Open("db", opts)
	require.NoError(t, err)
	defer db.Close()
	got, ok = db.ClockMark()
	require.True(t, ok)
	assert.True(t, mark.Equal(got))
	claim(t, db, scope("k"), fp("a"))
	pebblestore.RequireConsistent(t, db)
}

// TestClockBehindHoldsReconciliation steps the clock back a little past
// the tolerance while a claim is overdue: the reconciler gets no lease
// until the clock is right.
func TestClockBehindHoldsReconciliation(t *testing.T) {
	var calls int
	db, clock := idemtest.Open(t, &pebblestore.Options{Logger: discard(), TTL: time.Hour, Lease: time.Minute,
		Reconcile: func(ctx context.Context, l idem.Lease) error { calls++; return l.MarkUnknown(ctx) }})
	claim(t, db, scope("stuck"), fp("a"))
	clock.Advance(2 * time.Minute)
	claim(t, db, scope("later"), fp("a"))

	clock.Advance(-10 * time.Second)
	_, err := db.Reconcile(ctx)
	require.ErrorIs(t, err, idem.ErrClockBehind)
	assert.Zero(t, calls)
	rec, err := db.Get(ctx, scope("stuck"))
	require.NoError(t, err)
	assert.Equal(t, idem.StateInProgress, rec.State)

	clock.Advance(10 * time.Second)
	res, err := db.Reconcile(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, res.Resolved)
	assert.Equal(t, 1, calls)
}
