package rows

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/commit"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/record"
	"github.com/idemkv/idem/internal/walfs"
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

// openTable opens rows over a Pebble store on fs, runs the filter loop
// as the store does, and waits for its first filter. Everything closes
// when the test ends.
func openTable(t *testing.T, fs vfs.FS) *Table {
	t.Helper()
	yield := new(atomic.Bool)
	pdb, err := pebble.Open("db", &pebble.Options{FS: fs, Comparer: commit.Comparer(yield), Logger: walfs.Logger{L: slog.New(slog.DiscardHandler)}})
	require.NoError(t, err)
	c := commit.New(pdb, yield, 16<<20, nil)
	stop := make(chan struct{})
	tb := New(pdb, c, stop, 0)
	var loop sync.WaitGroup
	loop.Go(func() { tb.FilterLoop(func(err error) { t.Errorf("filter build: %v", err) }) })
	t.Cleanup(func() {
		close(stop)
		loop.Wait()
		c.Close()
		pdb.Close()
	})
	// Wait for the loop's first build: one that came after a test's own
	// build would replace the filter the test means to check. Nothing
	// else builds, so the first filter to appear is the loop's.
	require.Eventually(t, func() bool { return tb.filters.Load().cur != nil }, 10*time.Second, time.Millisecond)
	return tb
}

func testKey(i int) []byte {
	return keys.AppendRecord(nil, fmt.Sprintf("t%d", i%7), "POST /v1/payments", fmt.Sprintf("key-%d", i))
}

// testNow is the time the tests' records are written and read at.
var testNow = time.Unix(1_700_000_000, 0)

// read reads the record of key i under its stripe, as the store does.
func read(tb *Table, i int) (*record.Stored, bool, error) {
	rk := testKey(i)
	st := tb.Stripe(rk)
	st.Lock()
	defer st.Unlock()
	return tb.ReadLocked(rk, testNow)
}

// storeRecords writes records for keys from..to-1, completed for the even
// ones and in progress for the odd, each under its stripe.
func storeRecords(t *testing.T, tb *Table, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		rk := testKey(i)
		st := tb.Stripe(rk)
		st.Lock()
		old, _, err := tb.ReadLocked(rk, testNow)
		if err == nil {
			rec := &record.Stored{Record: idem.Record{State: idem.StateInProgress, CreatedAt: testNow,
				ExpiresAt: testNow.Add(time.Hour), LeaseUntil: testNow.Add(time.Minute), Attempts: 1}}
			if i%2 == 0 {
				rec.State, rec.Response.Status = idem.StateCompleted, 201
			}
			_, err = tb.WriteLocked(rk, old, rec, nil)
		}
		st.Unlock()
		require.NoError(t, err, "key %d", i)
		require.Nil(t, old, "key %d was stored already", i)
	}
}

// requireStored checks that every key in from..to-1 reads back as it was
// stored, never as absent.
func requireStored(t *testing.T, tb *Table, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		rec, live, err := read(tb, i)
		require.NoError(t, err, "key %d", i)
		require.NotNil(t, rec, "key %d read as absent: the filter lost it", i)
		assert.True(t, live, "key %d", i)
		want := idem.StateInProgress
		if i%2 == 0 {
			want = idem.StateCompleted
		}
		require.Equal(t, want, rec.State, "key %d", i)
	}
}

func TestFilterKnowsRecordsStoredBeforeOpen(t *testing.T) {
	fs := vfs.NewMem()
	first := openTable(t, fs)
	storeRecords(t, first, 0, 500)
	require.NoError(t, first.pdb.Flush())

	// A second table over a copy of the store: what a reopen finds.
	copied := vfs.NewMem()
	_, err := vfs.Clone(fs, copied, "db", "db")
	require.NoError(t, err)
	tb := openTable(t, copied)
	require.NotNil(t, tb.filters.Load().cur)
	assert.Equal(t, int64(500), tb.filters.Load().cur.added.Load(), "records the first build found")
	requireStored(t, tb, 0, 500)

	// And it is in use: keys never stored mostly skip the read.
	skipped := 0
	for i := 1000; i < 2000; i++ {
		if !tb.mayExist(tb.hash(testKey(i))) {
			skipped++
		}
	}
	assert.Greater(t, skipped, 950)
}

func TestFilterKnowsWritesMadeWhileItIsBuilt(t *testing.T) {
	tb := openTable(t, vfs.NewMem())
	storeRecords(t, tb, 0, 100)
	// These commit after the scan took its snapshot, so only the writers'
	// own adds can put them in the new filter.
	require.NoError(t, tb.BuildFilter(func() { storeRecords(t, tb, 100, 200) }))
	requireStored(t, tb, 0, 200)
}

func TestFilterGrowsWithTheStoreWhileWritesGoOn(t *testing.T) {
	tb := openTable(t, vfs.NewMem())
	tb.building.Lock()
	tb.minFilter = 16
	tb.building.Unlock()
	require.NoError(t, tb.BuildFilter(nil))
	require.Equal(t, int64(16), tb.filters.Load().cur.capacity)

	// Writers fill filter after filter while the background loop rebuilds
	// them; each checks its own key right after writing it.
	const writers, each = 8, 300
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := w * each; i < (w+1)*each; i++ {
				rk := testKey(i)
				st := tb.Stripe(rk)
				st.Lock()
				rec := &record.Stored{Record: idem.Record{State: idem.StateInProgress, ExpiresAt: testNow.Add(time.Hour)}}
				_, err := tb.WriteLocked(rk, nil, rec, nil)
				var got *record.Stored
				if err == nil {
					got, _, err = tb.ReadLocked(rk, testNow)
				}
				st.Unlock()
				if err != nil {
					errs <- err
					return
				}
				if got == nil {
					errs <- fmt.Errorf("key %d read back as absent", i)
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
	require.NoError(t, tb.BuildFilter(nil))
	require.NoError(t, tb.BuildFilter(nil))
	f := tb.filters.Load().cur
	assert.Equal(t, int64(writers*each), f.added.Load(), "records the last build found")
	assert.GreaterOrEqual(t, f.capacity, 2*f.added.Load(), "the filter did not grow with the store")
	for i := range writers * each {
		rec, _, err := read(tb, i)
		require.NoError(t, err, "key %d", i)
		require.NotNil(t, rec, "key %d", i)
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

func TestFilterKeysWithinABound(t *testing.T) {
	assert.Equal(t, int64(0), filterKeysWithin(0), "no bound")
	assert.Equal(t, int64(-1), filterKeysWithin(minFilterKeys*2-1), "too small for the first filter")
	for _, bytes := range []int64{minFilterKeys * 2, 1 << 20, 3<<20 + 5} {
		keys := filterKeysWithin(bytes)
		f := newKeyFilter(keys)
		assert.Equal(t, keys, f.capacity, "a filter sized for the bound is not rounded up")
		assert.LessOrEqual(t, int64(len(f.words))*8, bytes)
		assert.Greater(t, int64(len(f.words))*16, bytes, "the largest filter that fits")
	}
}

func TestFilterDroppedWhenTheStoreOutgrowsItsBound(t *testing.T) {
	tb := openTable(t, vfs.NewMem())
	tb.building.Lock()
	tb.minFilter, tb.maxFilter = 16, 64
	tb.building.Unlock()
	storeRecords(t, tb, 0, 100)
	require.NoError(t, tb.BuildFilter(nil))
	assert.Nil(t, tb.filters.Load().cur, "100 keys do not fit a filter of 64")
	assert.True(t, tb.dropped.Load())
	// Without a filter every read goes to Pebble: stored keys are found,
	// and absent ones may exist.
	requireStored(t, tb, 0, 100)
	assert.True(t, tb.mayExist(tb.hash(testKey(1000))))

	// Once sweeps bring the store under the bound (here the bound grows
	// instead), a sweep's report brings the filter back.
	tb.building.Lock()
	tb.maxFilter = 1024
	tb.building.Unlock()
	tb.Swept()
	require.Eventually(t, func() bool { return tb.filters.Load().cur != nil }, 10*time.Second, time.Millisecond)
	assert.False(t, tb.dropped.Load())
	requireStored(t, tb, 0, 100)
}
