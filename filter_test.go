package idem

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKeyFilterHasNoFalseNegativesAndFewFalsePositives(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, capacity := range []int64{1, 1000, 100_000} {
		f := newKeyFilter(capacity)
		require.GreaterOrEqual(t, f.capacity, capacity)
		added := make([]uint64, capacity)
		for i := range added {
			added[i] = rng.Uint64()
			f.add(added[i])
		}
		for _, h := range added {
			require.True(t, f.mayContain(h), "capacity %d: a key added reads as absent", capacity)
		}
		if capacity < 1000 {
			continue
		}
		const probes = 100_000
		hits := 0
		for range probes {
			if f.mayContain(rng.Uint64()) {
				hits++
			}
		}
		// 16 bits and 4 probes per key give about 0.5% when full; 2% means a broken
		// layout, such as probes that share bits.
		assert.Less(t, float64(hits)/probes, 0.02, "capacity %d", capacity)
	}
}

// openFilterTest opens a store on fs and waits for its first filter.
func openFilterTest(t *testing.T, fs vfs.FS) *DB {
	t.Helper()
	db, err := Open("db", &Options{FS: fs, SweepInterval: -1})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	// Wait for the background loop's first build: one that came after a
	// test's own build would replace the filter the test means to check.
	// Nothing else builds, so the first filter to appear is the loop's.
	require.Eventually(t, func() bool { return db.filters.Load().cur != nil }, 10*time.Second, time.Millisecond)
	return db
}

func filterScope(i int) Scope {
	return Scope{Tenant: fmt.Sprintf("t%d", i%7), Endpoint: "POST /v1/payments", Key: fmt.Sprintf("key-%d", i)}
}

var filterFP = Fingerprint(sha256.Sum256([]byte("same request")))

// storeRecords claims keys from..to-1 and completes the even ones.
func storeRecords(t *testing.T, db *DB, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		l, rec, err := db.Claim(context.Background(), filterScope(i), filterFP)
		require.NoError(t, err, "key %d", i)
		require.Nil(t, rec, "key %d", i)
		if i%2 == 0 {
			require.NoError(t, l.Complete(context.Background(), Response{Status: 201, Body: []byte("paid")}))
		}
	}
}

// requireStored checks that every key in from..to-1 is found, as a replay
// or as in progress, never as a fresh claim.
func requireStored(t *testing.T, db *DB, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		l, rec, err := db.Claim(context.Background(), filterScope(i), filterFP)
		require.Nil(t, l, "key %d was claimed again: the filter lost it", i)
		if i%2 == 0 {
			require.NoError(t, err, "key %d", i)
			require.Equal(t, "paid", string(rec.Response.Body), "key %d", i)
		} else {
			require.ErrorIs(t, err, ErrInProgress, "key %d", i)
		}
	}
}

func TestFilterKnowsRecordsStoredBeforeOpen(t *testing.T) {
	fs := vfs.NewMem()
	db := openFilterTest(t, fs)
	storeRecords(t, db, 0, 500)
	require.NoError(t, db.Close())

	db = openFilterTest(t, fs)
	require.NotNil(t, db.filters.Load().cur)
	assert.Equal(t, int64(500), db.filters.Load().cur.added.Load(), "records the first build found")
	requireStored(t, db, 0, 500)

	// And it is in use: keys never stored mostly skip the read.
	skipped := 0
	for i := 1000; i < 2000; i++ {
		if !db.mayExist(db.hash(recordKey(filterScope(i)))) {
			skipped++
		}
	}
	assert.Greater(t, skipped, 950)
}

func TestFilterKnowsWritesMadeWhileItIsBuilt(t *testing.T) {
	db := openFilterTest(t, vfs.NewMem())
	storeRecords(t, db, 0, 100)
	// These commit after the scan took its snapshot, so only the writers'
	// own adds can put them in the new filter.
	require.NoError(t, db.buildFilter(func() { storeRecords(t, db, 100, 200) }))
	requireStored(t, db, 0, 200)
}

func TestFilterGrowsWithTheStoreWhileWritesGoOn(t *testing.T) {
	db := openFilterTest(t, vfs.NewMem())
	db.building.Lock()
	db.minFilter = 16
	db.building.Unlock()
	require.NoError(t, db.buildFilter(nil))
	require.Equal(t, int64(16), db.filters.Load().cur.capacity)

	// Writers fill filter after filter while the background loop rebuilds
	// them; each checks its own key right after writing it.
	const writers, each = 8, 300
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := w * each; i < (w+1)*each; i++ {
				s := filterScope(i)
				if _, _, err := db.Claim(context.Background(), s, filterFP); err != nil {
					errs <- err
					return
				}
				if l, _, err := db.Claim(context.Background(), s, filterFP); l != nil || !errors.Is(err, ErrInProgress) {
					errs <- fmt.Errorf("key %d read back as fresh (lease %v, err %v)", i, l != nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// A build sizes its filter from the one before: two in a row with no
	// writes between end sized for the whole store.
	require.NoError(t, db.buildFilter(nil))
	require.NoError(t, db.buildFilter(nil))
	f := db.filters.Load().cur
	assert.Equal(t, int64(writers*each), f.added.Load(), "records the last build found")
	assert.GreaterOrEqual(t, f.capacity, 2*f.added.Load(), "the filter did not grow with the store")
	for i := range writers * each {
		l, _, err := db.Claim(context.Background(), filterScope(i), filterFP)
		require.Nil(t, l, "key %d", i)
		require.ErrorIs(t, err, ErrInProgress, "key %d", i)
	}
}

// TestFilterBornFull: the filter that replaces a full one is born about
// half full and lasts until it fills; one built on a store larger than
// the count it was sized from, or filled by writes during its build, is
// replaced at once.
func TestFilterBornFull(t *testing.T) {
	old := newKeyFilter(1 << 17)
	old.added.Store(old.capacity) // the build that filled it starts now
	grown := newKeyFilter(filterCapacity(old, minFilterKeys))
	grown.added.Store(old.capacity + old.capacity/20) // and writes went on meanwhile
	assert.False(t, grown.bornFull(), "a filter that replaced a full one is built again at once")

	busy := newKeyFilter(filterCapacity(old, minFilterKeys))
	busy.added.Store(old.capacity * 2) // writes during its build filled it
	assert.True(t, busy.bornFull())

	first := newKeyFilter(filterCapacity(nil, minFilterKeys))
	first.added.Store(8 * minFilterKeys) // Open on a store eight times the minimum
	assert.True(t, first.bornFull())
}

// TestFilterCapacity: a filter is replaced by one sized for twice the keys
// it holds, counting those written since its build, so that a filter the
// writes filled is outgrown in one build.
func TestFilterCapacity(t *testing.T) {
	assert.Equal(t, int64(16), filterCapacity(nil, 16), "first build")
	filled := newKeyFilter(16)
	filled.added.Store(16) // 4 found by its build, 12 written since
	assert.Equal(t, int64(32), filterCapacity(filled, 16))
	small := newKeyFilter(16)
	small.added.Store(3)
	assert.Equal(t, int64(16), filterCapacity(small, 16), "never below the minimum")
}
