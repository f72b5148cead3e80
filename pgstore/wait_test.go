package pgstore_test

import (
	"context"
	"fmt"
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

// wakeBound bounds how long a wake-up across replicas may take. Only a
// broken store reaches it.
const wakeBound = 10 * time.Second

// fallbackBound bounds a wake-up while the listener is reconnecting: a
// reconnection or a few re-reads of the record.
const fallbackBound = 3 * time.Second

func scope(key string) idem.Scope {
	return idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: key}
}

var fp = idem.Fingerprint{1}

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
func waitOn(t *testing.T, s *pgstore.Store, sc idem.Scope) <-chan error {
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

func TestReplicasWaitWokenAcross(t *testing.T) {
	a, b := replicas(t, idemtest.NewClock(), nil)
	l, _, err := a.Claim(t.Context(), scope("k"), fp)
	require.NoError(t, err)
	woke := waitOn(t, b, scope("k"))
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 200}))
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
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 200}))
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

// A waiter that starts as the lease ends is either notified or sees the
// end when it reads the record: ends are announced only to records marked
// waited on, and the mark and the end are ordered by the row's lock.
// Waiters on both replicas race the end of the lease, many times over;
// every one returns within wakeBound.
func TestReplicasWaitRacesTheEnd(t *testing.T) {
	a, b := replicas(t, idemtest.NewClock(), nil)
	const rounds = 200
	for i := range rounds {
		sc := scope(fmt.Sprintf("k%d", i))
		l, _, err := a.Claim(t.Context(), sc, fp)
		require.NoError(t, err)
		start := make(chan struct{})
		woke := make(chan error, 2)
		for _, s := range []*pgstore.Store{a, b} {
			go func() {
				<-start
				woke <- s.Wait(t.Context(), sc)
			}()
		}
		close(start)
		// Spread the end over the waiters' steps: registering, marking
		// and reading the record.
		time.Sleep(time.Duration(i%8) * 250 * time.Microsecond)
		if i%2 == 0 {
			require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 200}))
		} else {
			require.NoError(t, l.Release(t.Context()))
		}
		within(t, woke, wakeBound)
		within(t, woke, wakeBound)
	}
}
