package pebblestore_test

import (
	"context"
	"fmt"
	"sync/atomic"
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

func countFamilies(t *testing.T, db *pebblestore.Store) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, tag := range "rxpb" {
		n, err := db.CountFamily(byte(tag))
		require.NoError(t, err)
		out[string(tag)] = n
	}
	return out
}

func TestSweepDeletesEverythingExpired(t *testing.T) {
	db, clock := idemtest.Open(t, &pebblestore.Options{InlineBodyBytes: 1 << 10, MaxBodyBytes: 1 << 20, CompactBytes: 1})
	big := idem.Response{Status: 200, Body: make([]byte, 300<<10)}
	for i := range 50 {
		require.NoError(t, claim(t, db, scope(fmt.Sprint("big", i)), fp("a")).Complete(ctx, big))
		require.NoError(t, claim(t, db, scope(fmt.Sprint("small", i)), fp("a")).Complete(ctx, paid))
		require.NoError(t, claim(t, db, scope(fmt.Sprint("unknown", i)), fp("a")).MarkUnknown(ctx))
		claim(t, db, scope(fmt.Sprint("running", i)), fp("a"))
	}
	before := countFamilies(t, db)
	assert.Equal(t, map[string]int{"r": 200, "x": 200, "p": 100, "b": 50 * 5}, before)

	clock.Advance(24*time.Hour - time.Nanosecond)
	res, err := db.Sweep(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Records, "nothing has expired yet")
	assert.Equal(t, before, countFamilies(t, db))

	// A key claimed again later must survive the sweep of its first life.
	clock.Advance(time.Nanosecond)
	require.NoError(t, claim(t, db, scope("big0"), fp("b")).Complete(ctx, paid))

	res, err = db.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, 199, res.Records)
	assert.Greater(t, res.Bytes, int64(49*300<<10))
	assert.Equal(t, map[string]int{"r": 1, "x": 1, "p": 0, "b": 0}, countFamilies(t, db))
	rec, err := db.Get(ctx, scope("big0"))
	require.NoError(t, err)
	assert.Equal(t, paid.Body, rec.Response.Body)
	pebblestore.RequireConsistent(t, db)

	m, err := db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(199), m.Events[idem.EventSwept])
	assert.Equal(t, res.Bytes, m.BytesReclaimed)
	assert.Positive(t, figure(t, m, pebblestore.FigureSweepCompactions))
	assert.Zero(t, m.InProgress)
	assert.Zero(t, m.UnknownRecords)

	res, err = db.Sweep(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Records, "a second sweep finds nothing")
}

func TestExpiredRecordsReadAsAbsentBeforeSweep(t *testing.T) {
	db, clock := idemtest.Open(t, nil)
	require.NoError(t, claim(t, db, scope("k"), fp("a")).Complete(ctx, paid))
	clock.Advance(24 * time.Hour)
	_, err := db.Get(ctx, scope("k"))
	assert.ErrorIs(t, err, idem.ErrNotFound)
	// Claiming over the expired record leaves no trace of it behind.
	claim(t, db, scope("k"), fp("b"))
	pebblestore.RequireConsistent(t, db)
	assert.Equal(t, map[string]int{"r": 1, "x": 1, "p": 1, "b": 0}, countFamilies(t, db))
}

// TestSweepReclaimsDiskSpace runs on a real directory: once records expire,
// a sweep with its compaction must give the space back to the filesystem.
func TestSweepReclaimsDiskSpace(t *testing.T) {
	clock := fake.NewClock()
	db, err := pebblestore.Open(t.TempDir(), &pebblestore.Options{Now: clock.Now, SweepInterval: -1, CompactBytes: 1 << 20})
	require.NoError(t, err)
	defer db.Close()
	body := make([]byte, 256<<10)
	for i := range body {
		body[i] = byte(i * 31) // poorly compressible enough to take real space
	}
	for i := range 160 {
		body[0] = byte(i)
		require.NoError(t, claim(t, db, scope(fmt.Sprint(i)), fp("a")).Complete(ctx, idem.Response{Status: 200, Body: body}))
	}
	full, err := db.Metrics(context.Background())
	require.NoError(t, err)
	require.Greater(t, figure(t, full, pebblestore.FigureDiskBytes), float64(30<<20))

	clock.Advance(25 * time.Hour)
	res, err := db.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, 160, res.Records)
	assert.Positive(t, res.Compactions)
	empty, err := db.Metrics(context.Background())
	require.NoError(t, err)
	t.Logf("disk usage %.0f -> %.0f bytes", figure(t, full, pebblestore.FigureDiskBytes), figure(t, empty, pebblestore.FigureDiskBytes))
	assert.Less(t, figure(t, empty, pebblestore.FigureDiskBytes), figure(t, full, pebblestore.FigureDiskBytes)/4)
}

func TestReconcile(t *testing.T) {
	const lease = 10 * time.Second
	tests := []struct {
		name    string
		resolve func(ctx context.Context, l idem.Lease) error
		check   func(t *testing.T, db *pebblestore.Store, res idem.ReconcileResult)
	}{
		{
			name:    "found the business record: complete",
			resolve: func(ctx context.Context, l idem.Lease) error { return l.Complete(ctx, paid) },
			check: func(t *testing.T, db *pebblestore.Store, res idem.ReconcileResult) {
				assert.Equal(t, idem.ReconcileResult{Overdue: 1, Resolved: 1}, res)
				_, rec, err := db.Claim(ctx, scope("k"), fp("a"))
				require.NoError(t, err)
				assert.Equal(t, paid, rec.Response)
				assert.Equal(t, uint32(2), rec.Attempts, "the reconciler's lease counts")
			},
		},
		{
			name:    "provably never happened: release",
			resolve: func(ctx context.Context, l idem.Lease) error { return l.Release(ctx) },
			check: func(t *testing.T, db *pebblestore.Store, res idem.ReconcileResult) {
				assert.Equal(t, 1, res.Resolved)
				claim(t, db, scope("k"), fp("a"))
			},
		},
		{
			name:    "cannot tell: unknown",
			resolve: func(ctx context.Context, l idem.Lease) error { return l.MarkUnknown(ctx) },
			check: func(t *testing.T, db *pebblestore.Store, res idem.ReconcileResult) {
				assert.Equal(t, 1, res.Resolved)
				_, _, err := db.Claim(ctx, scope("k"), fp("a"))
				keyErr(t, err, idem.ErrOutcomePending, idem.StateUnknown)
			},
		},
		{
			name:    "gives up: the record comes due again a lease later",
			resolve: func(ctx context.Context, l idem.Lease) error { return fmt.Errorf("provider down") },
			check: func(t *testing.T, db *pebblestore.Store, res idem.ReconcileResult) {
				assert.Equal(t, idem.ReconcileResult{Overdue: 1}, res)
				_, _, err := db.Claim(ctx, scope("k"), fp("a"))
				keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
				again, err := db.Reconcile(ctx)
				require.NoError(t, err)
				assert.Zero(t, again.Overdue, "the reconciler holds a fresh lease")
			},
		},
		{
			name: "no reconciler: counted, untouched",
			check: func(t *testing.T, db *pebblestore.Store, res idem.ReconcileResult) {
				assert.Equal(t, idem.ReconcileResult{Overdue: 1}, res)
				_, _, err := db.Claim(ctx, scope("k"), fp("a"))
				keyErr(t, err, idem.ErrOutcomePending, idem.StateInProgress)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, clock := idemtest.Open(t, &pebblestore.Options{Lease: lease, Reconcile: tt.resolve, Logger: discard()})
			holder := claim(t, db, scope("k"), fp("a"))
			require.NoError(t, claim(t, db, scope("done"), fp("a")).Complete(ctx, paid))
			clock.Advance(lease - time.Second)
			claim(t, db, scope("young"), fp("a"))
			clock.Advance(time.Second)
			overdue, err := db.Overdue(ctx, 0)
			require.NoError(t, err)
			require.Len(t, overdue, 1, "only k is past its lease")
			assert.Equal(t, scope("k"), overdue[0].Scope)

			res, err := db.Reconcile(ctx)
			require.NoError(t, err)
			tt.check(t, db, res)
			if tt.resolve != nil {
				assert.ErrorIs(t, holder.Complete(ctx, paid), idem.ErrLeaseLost, "the slow holder must not race the reconciler")
			}
			pebblestore.RequireConsistent(t, db)
		})
	}
}

// TestBackgroundLoop checks that the loop sweeps and reconciles on its own,
// and that Close stops it and waits for it.
func TestBackgroundLoop(t *testing.T) {
	clock := fake.NewClock()
	fs := vfs.NewMem()
	calls := make(chan idem.Lease)
	var closed atomic.Bool
	db, err := pebblestore.Open("db", pebblefs.With(&pebblestore.Options{Now: clock.Now, SweepInterval: time.Millisecond, Lease: time.Second, Logger: discard(),
		Reconcile: func(ctx context.Context, l idem.Lease) error {
			if closed.Load() {
				t.Error("reconciler called after Close returned")
			}
			// Marked before the test hears of it: the test closes the
			// store next, which would cancel a mark still to come.
			err := l.MarkUnknown(ctx)
			calls <- l
			return err
		},
	}, fs))
	require.NoError(t, err)
	require.NoError(t, claim(t, db, scope("old"), fp("a")).Complete(ctx, paid))
	clock.Advance(25 * time.Hour)
	claim(t, db, scope("stuck"), fp("a"))
	clock.Advance(2 * time.Second)

	l := <-calls
	assert.Equal(t, scope("stuck"), l.Scope())
	require.NoError(t, db.Close())
	closed.Store(true)

	reopened, err := pebblestore.Open("db", pebblefs.With(&pebblestore.Options{Now: clock.Now, SweepInterval: -1}, fs))
	require.NoError(t, err)
	defer reopened.Close()
	_, err = reopened.Get(ctx, scope("old"))
	assert.ErrorIs(t, err, idem.ErrNotFound)
	n, err := reopened.CountFamily('r')
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the loop swept the expired record before it reconciled")
	rec, err := reopened.Get(ctx, scope("stuck"))
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State)
}
