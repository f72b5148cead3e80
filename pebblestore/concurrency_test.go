package pebblestore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/pebblestore"
)

// TestConcurrentClaimsOneWinner has 64 goroutines claim the same keys in
// different orders. Each key must have exactly one winner, and every other
// caller must see either the winner's claim in progress or its response.
func TestConcurrentClaimsOneWinner(t *testing.T) {
	const workers, nkeys = 64, 200
	db, _ := idemtest.Open(t, nil)
	var (
		mu      sync.Mutex
		winners = map[string][]int{}
		replays = map[string][]string{}
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for _, i := range rng.Perm(nkeys) {
				key := fmt.Sprintf("key-%d", i)
				l, rec, err := db.Claim(ctx, scope(key), fp("same"))
				switch {
				case err == nil && l != nil:
					mu.Lock()
					winners[key] = append(winners[key], w)
					mu.Unlock()
					if !assert.NoError(t, l.Complete(ctx, idem.Response{Status: 200, Body: fmt.Appendf(nil, "winner %d", w)})) {
						return
					}
				case err == nil:
					mu.Lock()
					replays[key] = append(replays[key], string(rec.Response.Body))
					mu.Unlock()
				case !errors.Is(err, idem.ErrInProgress):
					t.Errorf("claim %s: %v", key, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Len(t, winners, nkeys)
	for key, ws := range winners {
		require.Len(t, ws, 1, "key %s won by %v", key, ws)
		for _, body := range replays[key] {
			assert.Equal(t, fmt.Sprintf("winner %d", ws[0]), body, "replay of %s", key)
		}
	}
	m, err := db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(nkeys), m.Events[idem.EventClaimed])
	assert.Equal(t, int64(workers*nkeys-nkeys), m.Events[idem.EventReplayed]+m.Events[idem.EventConflict])
	pebblestore.RequireConsistent(t, db)
}
