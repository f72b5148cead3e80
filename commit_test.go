package idem

import (
	"bytes"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestYieldingComparerOrdersLikeBytes checks that the store's comparer
// orders keys exactly as Pebble's default does, and that an armed flag is
// spent by one comparison only.
func TestYieldingComparerOrdersLikeBytes(t *testing.T) {
	var flag atomic.Bool
	cmp := yieldingComparer(&flag)
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
