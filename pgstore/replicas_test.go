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

	"github.com/idemkv/idem/contract"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// wakeBound bounds how long a wake-up across replicas may take. Only a
// broken store reaches it.
const wakeBound = 10 * time.Second

// fallbackBound bounds a wake-up while the listener is reconnecting: a
// reconnection or a few re-reads of the record.
const fallbackBound = 3 * time.Second

func scope(key string) contract.Scope {
	return contract.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: key}
}

var fp = contract.Fingerprint{1}

// replicas opens two stores on one fresh database, sharing clock.
func replicas(t *testing.T, clock *idemtest.Clock, opts func(o *pgstore.Options)) (a, b *pgstore.Store) {
	t.Helper()
	dsn := pgtest.DSN(t)
	mk := func() *pgstore.Options {
		o := &pgstore.Options{Now: clock.Now}
		if opts != nil {
			opts(o)
		}
		return o
	}
	return open(t, dsn, mk()), open(t, dsn, mk())
}

// waitOn starts Wait on s and checks for a moment that it blocks.
func waitOn(t *testing.T, s *pgstore.Store, sc contract.Scope) <-chan error {
	t.Helper()
	woke := make(chan error, 1)
	go func() { woke <- s.Wait(t.Context(), sc) }()
	select {
	case err := <-woke:
		t.Fatalf("Wait returned (%v) while the key was held", err)
	case <-time.After(50 * time.Millisecond):
	}
	return woke
}

func within(t *testing.T, woke <-chan error, bound time.Duration) {
	t.Helper()
	select {
	case err := <-woke:
		require.NoError(t, err)
	case <-time.After(bound):
		t.Fatalf("Wait did not return within %s", bound)
	}
}

func TestReplicasOneWinner(t *testing.T) {
	a, b := replicas(t, idemtest.NewClock(), nil)
	const claimers = 64
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners int
		start   = make(chan struct{})
	)
	for i := range claimers {
		store := a
		if i%2 == 1 {
			store = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			l, rec, err := store.Claim(t.Context(), scope("k"), fp)
			switch {
			case err == nil && l != nil:
				mu.Lock()
				winners++
				mu.Unlock()
			case err == nil:
				t.Errorf("a replay (%v) of a key nobody completed", rec)
			default:
				assert.ErrorIs(t, err, contract.ErrInProgress)
			}
		}()
	}
	close(start)
	wg.Wait()
	assert.Equal(t, 1, winners)
}

func TestReplicasWaitWokenAcross(t *testing.T) {
	a, b := replicas(t, idemtest.NewClock(), nil)
	l, _, err := a.Claim(t.Context(), scope("k"), fp)
	require.NoError(t, err)
	woke := waitOn(t, b, scope("k"))
	require.NoError(t, l.Complete(t.Context(), contract.Response{Status: 200}))
	within(t, woke, wakeBound)
}

func TestReplicasWaitSurvivesListenerLoss(t *testing.T) {
	dsn := pgtest.DSN(t)
	clock := idemtest.NewClock()
	a := open(t, dsn, &pgstore.Options{Now: clock.Now})
	b := open(t, dsn, &pgstore.Options{Now: clock.Now})
	l, _, err := a.Claim(t.Context(), scope("k"), fp)
	require.NoError(t, err)

	pid := pgstore.ListenerPID(b)
	require.NotZero(t, pid)
	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var name string
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT application_name FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&name))
	assert.Equal(t, "idem-pgstore-listener", name)
	var killed bool
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&killed))
	require.True(t, killed)

	woke := waitOn(t, b, scope("k"))
	require.NoError(t, l.Complete(t.Context(), contract.Response{Status: 200}))
	within(t, woke, fallbackBound)

	// The listener comes back, and wakes waiters by notification again.
	require.Eventually(t, func() bool {
		p := pgstore.ListenerPID(b)
		return p != 0 && p != pid
	}, wakeBound, 10*time.Millisecond)
	l, _, err = a.Claim(t.Context(), scope("k2"), fp)
	require.NoError(t, err)
	woke = waitOn(t, b, scope("k2"))
	require.NoError(t, l.Release(t.Context()))
	within(t, woke, wakeBound)
}

func TestReplicasReconcileEachRecordOnce(t *testing.T) {
	const n = 60
	clock := idemtest.NewClock()
	var (
		mu      sync.Mutex
		handled = map[string]int{}
	)
	reconcile := func(ctx context.Context, l contract.Lease) error {
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

	results := make([]contract.ReconcileResult, 4)
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
