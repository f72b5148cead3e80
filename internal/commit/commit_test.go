package commit

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idem/internal/walfs"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestYieldingComparerOrdersLikeBytes checks that the store's comparer
// orders keys exactly as Pebble's default does, and that an armed flag is
// spent by one comparison only.
func TestYieldingComparerOrdersLikeBytes(t *testing.T) {
	var flag atomic.Bool
	cmp := Comparer(&flag)
	require.Equal(t, "leveldb.BytewiseComparator", cmp.Name, "a new name would refuse every existing store")
	rng := rand.New(rand.NewPCG(1, 2))
	key := func() []byte {
		k := make([]byte, rng.IntN(4))
		for i := range k {
			k[i] = byte(rng.IntN(3))
		}
		return k
	}
	for range 1000 {
		a, b := key(), key()
		flag.Store(rng.IntN(2) == 0)
		assert.Equal(t, bytes.Compare(a, b), cmp.Compare(a, b), "%x %x", a, b)
		assert.False(t, flag.Load(), "a comparison spends the flag")
	}
}

// testGroupBytes is the store's group cap: a quarter of its 64 MiB
// memtable.
const testGroupBytes = 16 << 20

// TestGroupClosesAtByteCap holds the committer's token, so that no group
// commits, while one caller fills a group past testGroupBytes and two more
// arrive: they must form a group of their own, and every write must land.
func TestGroupClosesAtByteCap(t *testing.T) {
	pdb, err := pebble.Open("db", &pebble.Options{FS: vfs.NewMem(), Logger: walfs.Logger{L: slog.New(slog.DiscardHandler)}})
	require.NoError(t, err)
	defer pdb.Close()
	c := New(pdb, new(atomic.Bool), testGroupBytes, nil)
	defer c.Close()

	openGroup := func() *group {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.open
	}
	callers := func(g *group) int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return g.n
	}
	errs := make(chan error, 3)
	write := func(key string, size int) {
		go func() {
			errs <- c.Commit(func(b *pebble.Batch) error { return b.Set([]byte(key), make([]byte, size), nil) })
		}()
	}

	c.flushing <- struct{}{}
	first := openGroup()
	write("big", testGroupBytes)
	require.Eventually(t, func() bool { return openGroup() != first }, 10*time.Second, time.Millisecond,
		"a group past the cap must close to newcomers")
	second := openGroup()
	write("a", 10)
	write("b", 10)
	require.Eventually(t, func() bool { return callers(second) == 2 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, 1, callers(first))
	<-c.flushing

	for range 3 {
		require.NoError(t, <-errs)
	}
	assert.Equal(t, int64(3), c.commits.Load())
	assert.Equal(t, int64(2), c.syncs.Load(), "the small writes share one group")
	for _, k := range []string{"big", "a", "b"} {
		_, closer, err := pdb.Get([]byte(k))
		if assert.NoError(t, err, k) {
			closer.Close()
		}
	}
}
