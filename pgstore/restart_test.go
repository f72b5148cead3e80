package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// payOnce claims and completes key on s.
func payOnce(t *testing.T, s *pgstore.Store, key string) error {
	l, _, err := s.Claim(t.Context(), idem.Scope{Tenant: "t", Endpoint: "POST /pay", Key: key}, fp)
	if err != nil {
		return err
	}
	return l.Complete(t.Context(), idem.Response{Status: 201})
}

// burst runs payOnce for n keys at once and returns their errors.
func burst(t *testing.T, s *pgstore.Store, tag string, n int) []error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[g] = payOnce(t, s, fmt.Sprint(tag, g))
		}()
	}
	wg.Wait()
	return errs
}

// TestRestartLeavesNoFailure: the server crashes and is back within a
// second, so the pool's connections, used just before, are not pinged
// on their way out of the pool. No call fails once it accepts
// connections again: none is written into a connection the server has
// closed.
func TestRestartLeavesNoFailure(t *testing.T) {
	s := open(t, pgtest.DSN(t), quiet(nil))
	for round := range 3 {
		for _, err := range burst(t, s, fmt.Sprint("warm", round, "-"), 8) {
			require.NoError(t, err)
		}
		pgtest.Restart(t)
		for _, err := range burst(t, s, fmt.Sprint("after", round, "-"), 8) {
			assert.NoError(t, err, "a call after the restart")
		}
	}
}

// TestRestartUnderLoad crashes and restarts the server while claims and
// completions run on many goroutines. Calls during the outage may fail;
// every call that begins once the server accepts connections again
// succeeds.
func TestRestartUnderLoad(t *testing.T) {
	s := open(t, pgtest.DSN(t), quiet(nil))
	var (
		back  atomic.Int64 // UnixNano when the server was back, 0 before
		done  atomic.Bool
		ops   atomic.Int64
		mu    sync.Mutex
		after []error
		wg    sync.WaitGroup
	)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !done.Load(); i++ {
				began := time.Now().UnixNano()
				err := payOnce(t, s, fmt.Sprint(g, "-", i))
				ops.Add(1)
				if b := back.Load(); err != nil && b != 0 && began > b {
					mu.Lock()
					after = append(after, err)
					mu.Unlock()
				}
			}
		}()
	}
	for ops.Load() < 100 {
		time.Sleep(10 * time.Millisecond)
	}
	pgtest.Restart(t)
	back.Store(time.Now().UnixNano())
	resumed := ops.Load()
	for ops.Load() < resumed+500 {
		time.Sleep(10 * time.Millisecond)
	}
	done.Store(true)
	wg.Wait()
	assert.Empty(t, after, "calls that began after the server was back failed")
}

// TestReadOnlyServerIsAnOutage: the connections the pool holds reach a
// server that turned read-only, as after a demotion, while new ones reach
// one that takes writes, as target_session_attrs=read-write finds the new
// primary. A write refused as read-only empties the pool and runs again
// on a fresh connection; while every connection is read-only, calls fail
// as an outage (never as a refusal) and store nothing.
func TestReadOnlyServerIsAnOutage(t *testing.T) {
	dsn := pgtest.DSN(t)
	pgtest.Owned(t)
	s := open(t, dsn, quiet(nil))
	for _, err := range burst(t, s, "warm", 8) {
		require.NoError(t, err)
	}
	old := connect(t, dsn) // reports when the reload has reached sessions open now
	admin := connect(t, dsn)
	_, err := admin.Exec(t.Context(), "SET default_transaction_read_only = off")
	require.NoError(t, err)
	readOnly := func(ctx context.Context, on bool) {
		t.Helper()
		stmt := "ALTER SYSTEM RESET default_transaction_read_only"
		if on {
			stmt = "ALTER SYSTEM SET default_transaction_read_only = on"
		}
		_, err := admin.Exec(ctx, stmt)
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "SELECT pg_reload_conf()")
		require.NoError(t, err)
		want := map[bool]string{true: "on", false: "off"}[on]
		require.Eventually(t, func() bool {
			var v string
			return old.QueryRow(ctx, "SHOW default_transaction_read_only").Scan(&v) == nil && v == want
		}, 10*time.Second, 10*time.Millisecond)
	}
	t.Cleanup(func() { readOnly(context.Background(), false) })

	// Sessions that start from now on take writes; those open stay read-only.
	_, err = admin.Exec(t.Context(), "ALTER DATABASE "+pgx.Identifier{dbName(t, admin)}.Sanitize()+" SET default_transaction_read_only = off")
	require.NoError(t, err)
	readOnly(t.Context(), true)
	for _, err := range burst(t, s, "moved", 8) {
		assert.NoError(t, err, "a write after the pool's server turned read-only")
	}

	// Every connection read-only: an outage.
	_, err = admin.Exec(t.Context(), "ALTER DATABASE "+pgx.Identifier{dbName(t, admin)}.Sanitize()+" RESET default_transaction_read_only")
	require.NoError(t, err)
	require.Positive(t, terminate(t, admin, "application_name = 'idem-pgstore'"))
	err = payOnce(t, s, "nowhere")
	assertStoreUnavailable(t, err)
	readOnly(t.Context(), false)
	_, err = s.Get(t.Context(), idem.Scope{Tenant: "t", Endpoint: "POST /pay", Key: "nowhere"})
	assert.ErrorIs(t, err, idem.ErrNotFound)
}

func dbName(t *testing.T, conn *pgx.Conn) string {
	var name string
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&name))
	return name
}
