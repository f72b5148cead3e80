package pgstore_test

import (
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/contract"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// open opens a store on dsn and closes it when t ends.
func open(t *testing.T, dsn string, opts *pgstore.Options) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(t.Context(), dsn, opts)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	idemtest.TestStore(t, func(t *testing.T, now func() time.Time) contract.Store {
		return open(t, pgtest.DSN(t), &pgstore.Options{Now: now})
	})
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

func TestEventsAreLogged(t *testing.T) {
	var out syncBuffer
	s := open(t, pgtest.DSN(t), &pgstore.Options{Events: slog.New(slog.NewTextHandler(&out, nil))})
	l, _, err := s.Claim(t.Context(), scope("secret-key"), fp)
	require.NoError(t, err)
	require.NoError(t, l.Complete(t.Context(), contract.Response{Status: 201}))
	_, rec, err := s.Claim(t.Context(), scope("secret-key"), fp)
	require.NoError(t, err)
	require.NotNil(t, rec)
	logged := out.String()
	for _, e := range []contract.Event{contract.EventClaimed, contract.EventCompleted, contract.EventReplayed} {
		assert.Contains(t, logged, "event="+e.String())
	}
	assert.Contains(t, logged, "key_hash="+contract.KeyHash("secret-key"))
	assert.NotContains(t, logged, "secret-key")
	m, err := s.Metrics(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(1), m.Events[contract.EventReplayed])
}
