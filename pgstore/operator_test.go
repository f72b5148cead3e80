package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

func TestReplicasReconcileEachRecordOnce(t *testing.T) {
	const n = 60
	clock := idemtest.NewClock()
	var (
		mu      sync.Mutex
		handled = map[string]int{}
	)
	reconcile := func(ctx context.Context, l idem.Lease) error {
		mu.Lock()
		handled[l.Scope().Key]++
		mu.Unlock()
		return l.MarkFailed(ctx)
	}
	a, b := replicas(t, clock, func(o *pgstore.Options) { o.Reconcile = reconcile })
	var lease time.Duration
	for i := range n {
		l, _, err := a.Claim(t.Context(), scope(fmt.Sprint("k", i)), fp)
		require.NoError(t, err)
		r := l.Record()
		lease = r.LeaseUntil.Sub(r.CreatedAt)
	}
	clock.Advance(lease)

	results := make([]idem.ReconcileResult, 4)
	var wg sync.WaitGroup
	for i := range results {
		store := a
		if i%2 == 1 {
			store = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			results[i], err = store.Reconcile(t.Context())
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	total, resolved := 0, 0
	for _, r := range results {
		total += r.Overdue
		resolved += r.Resolved
	}
	assert.Equal(t, n, total, "overdue records taken, over all passes")
	assert.Equal(t, n, resolved)
	require.Len(t, handled, n)
	for key, times := range handled {
		assert.Equal(t, 1, times, "record %s handed out %d times", key, times)
	}
	overdue, err := b.Overdue(t.Context(), 0)
	require.NoError(t, err)
	assert.Empty(t, overdue)
}

func TestSweepBatchesAndTakesTurns(t *testing.T) {
	const n = 2500 // more than two of the sweeper's batches
	dsn := pgtest.DSN(t)
	clock := idemtest.NewClock()
	const skew = time.Minute // every record lives TTL+skew
	s := open(t, dsn, &pgstore.Options{Now: clock.Now, TTL: time.Hour, ClockSkew: skew})
	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	// Fill the table in one statement; the rows are what claims write.
	_, err = conn.Exec(t.Context(), `INSERT INTO idempotency_keys (tenant, endpoint, idem_key, fingerprint, state,
		lease_token, lease_until, attempts, created_at, updated_at, expires_at)
		SELECT 't', 'e', 'k' || i, '\x00'::bytea || repeat('x', 31)::bytea, 3, '\x01'::bytea, $1, 1, $1, $1, $2
		FROM generate_series(1, $3) AS i`, clock.Now(), clock.Now().Add(time.Hour), n)
	require.NoError(t, err)
	l, _, err := s.Claim(t.Context(), scope("young"), fp)
	require.NoError(t, err)
	require.NoError(t, l.MarkFailed(t.Context()))
	clock.Advance(time.Hour - time.Second)
	_, _, err = s.Claim(t.Context(), scope("younger"), fp)
	require.NoError(t, err)
	clock.Advance(time.Second + skew)

	// Another replica holds the sweeper's lock: this one leaves the work.
	_, err = conn.Exec(t.Context(), "SELECT pg_advisory_lock($1)", pgstore.LockSweep)
	require.NoError(t, err)
	res, err := s.Sweep(t.Context())
	require.NoError(t, err)
	assert.Zero(t, res.Records)
	_, err = conn.Exec(t.Context(), "SELECT pg_advisory_unlock($1)", pgstore.LockSweep)
	require.NoError(t, err)

	var steps []idem.CompactProgress
	res, err = s.Compact(t.Context(), func(p idem.CompactProgress) { steps = append(steps, p) })
	require.NoError(t, err)
	assert.Equal(t, n+1, res.Records)
	assert.Positive(t, res.Bytes)
	require.NotEmpty(t, steps)
	assert.Equal(t, idem.CompactProgress{Phase: "sweep", Done: n + 1, Total: n + 1}, steps[len(steps)-1])
	m, err := s.Metrics(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(n+1), m.Events[idem.EventSwept])
	assert.Equal(t, res.Bytes, m.BytesReclaimed)
	assert.Zero(t, m.Expired)
	assert.Equal(t, int64(1), m.InProgress, "the unexpired claim is kept")
	for _, name := range []string{"idem_pg_table_bytes", "idem_pg_pool_total_conns", "idem_pg_listener_connected"} {
		v, ok := m.Figure(name)
		assert.True(t, ok, name)
		assert.Positive(t, v, name)
	}
}

func TestRecordsPages(t *testing.T) {
	const n = 250 // more than two pages
	s := open(t, pgtest.DSN(t), &pgstore.Options{Now: idemtest.NewClock().Now})
	var want []string
	for i := range n {
		key := fmt.Sprintf("k%03d", i)
		want = append(want, key)
		_, _, err := s.Claim(t.Context(), scope(key), fp)
		require.NoError(t, err)
	}
	var got []string
	for rec, err := range s.Records(t.Context(), idem.Filter{Tenant: "acme"}) {
		require.NoError(t, err)
		got = append(got, rec.Scope.Key)
		if len(got) == n/2 {
			// The loop may use the store: no connection is held between pages.
			_, err := s.Get(t.Context(), scope("k000"))
			require.NoError(t, err)
		}
	}
	assert.Equal(t, want, got)
}

// TestLoopSweepsUntilClose: the store's own loop deletes expired records
// at its interval, and Close stops it before closing the pool.
func TestLoopSweepsUntilClose(t *testing.T) {
	clock := idemtest.NewClock()
	s := open(t, pgtest.DSN(t), quiet(&pgstore.Options{Now: clock.Now, Lease: time.Minute, TTL: time.Hour,
		SweepInterval: time.Millisecond}))
	l, _, err := s.Claim(t.Context(), scope("k"), fp)
	require.NoError(t, err)
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 200}))
	clock.Advance(2 * time.Hour)

	deadline := time.Now().Add(time.Minute)
	for {
		m, err := s.Metrics(t.Context())
		require.NoError(t, err)
		if m.Events[idem.EventSwept] == 1 {
			assert.Zero(t, m.Expired)
			break
		}
		require.True(t, time.Now().Before(deadline), "the loop swept nothing in a minute")
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.Ping(t.Context()), idem.ErrClosed)
	require.NoError(t, s.Close(), "a second Close is harmless")
}
