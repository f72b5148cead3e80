package keys

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type triple struct{ t, e, k string }

// randomPart draws from a tiny alphabet that includes bytes which look like
// lengths, so that collisions would show up if the encoding allowed them.
func randomPart(rng *rand.Rand) string {
	alphabet := []byte{0, 1, 2, 3, 'a', 'b', 0x7f, 0x80, 0xff}
	b := make([]byte, rng.IntN(6))
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// TestRecordKeyInjectiveAndPrefixFree is a property test: distinct scopes
// never share a record key, no record key is a prefix of another (which is
// what lets chunk and index keys append to it), and parsing inverts
// encoding.
func TestRecordKeyInjectiveAndPrefixFree(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[string]triple{}
	var all [][]byte
	for range 20000 {
		tr := triple{randomPart(rng), randomPart(rng), randomPart(rng)}
		rk := AppendRecord(nil, tr.t, tr.e, tr.k)
		if prev, ok := seen[string(rk)]; ok {
			require.Equal(t, prev, tr, "two scopes encode to %x", rk)
			continue
		}
		seen[string(rk)] = tr
		all = append(all, rk)
		gt, ge, gk, err := ParseRecord(rk)
		require.NoError(t, err)
		assert.Equal(t, tr, triple{gt, ge, gk})
	}
	require.Greater(t, len(all), 5000)
	for i := range all[:2000] {
		for j := range all {
			if i != j && bytes.HasPrefix(all[j], all[i]) {
				t.Fatalf("%x is a prefix of %x", all[i], all[j])
			}
		}
	}
}

func TestRecordKeyCollisionsThatNaiveJoinsAllow(t *testing.T) {
	pairs := [][2]triple{
		{{"a", "bc", "d"}, {"ab", "c", "d"}},
		{{"", "ab", "c"}, {"a", "b", "c"}},
		{{"a\x01b", "", "k"}, {"a", "\x01b", "k"}},
		{{"t", "e", "k"}, {"t", "e", "k\x00"}},
	}
	for _, p := range pairs {
		a := AppendRecord(nil, p[0].t, p[0].e, p[0].k)
		b := AppendRecord(nil, p[1].t, p[1].e, p[1].k)
		assert.NotEqual(t, a, b)
		assert.False(t, bytes.HasPrefix(a, b) || bytes.HasPrefix(b, a))
	}
}

func TestRecordSpanHoldsExactlyItsScope(t *testing.T) {
	in := func(k, lo, hi []byte) bool { return bytes.Compare(lo, k) <= 0 && bytes.Compare(k, hi) < 0 }
	lo, hi := RecordSpan("acme")
	assert.True(t, in(AppendRecord(nil, "acme", "e", "k"), lo, hi))
	assert.False(t, in(AppendRecord(nil, "acme2", "e", "k"), lo, hi))
	assert.False(t, in(AppendRecord(nil, "acm", "e", "k"), lo, hi))

	lo, hi = RecordSpan("acme", "POST /v1/payments")
	assert.True(t, in(AppendRecord(nil, "acme", "POST /v1/payments", "k"), lo, hi))
	assert.False(t, in(AppendRecord(nil, "acme", "POST /v1/payments/x", "k"), lo, hi))
	assert.False(t, in(AppendRecord(nil, "acme", "POST /v1/refunds", "k"), lo, hi))

	lo, hi = RecordSpan()
	assert.True(t, in(AppendRecord(nil, "\xff\xff", "\xff", "\xff"), lo, hi))
	assert.False(t, in(AppendIndex(nil, TagExpiry, 0, AppendRecord(nil, "t", "e", "k")), lo, hi))

	// A part ending in 0xff bytes still gets a span that holds only it.
	lo, hi = RecordSpan("a\xff")
	assert.True(t, in(AppendRecord(nil, "a\xff", "\xff", "\xff"), lo, hi))
	assert.False(t, in(AppendRecord(nil, "b", "e", "k"), lo, hi))
}

func TestParseRecordRejectsGarbage(t *testing.T) {
	good := AppendRecord(nil, "t", "e", "k")
	for _, bad := range [][]byte{nil, {TagRecord}, {TagExpiry, recordVersion}, good[:len(good)-1], append(bytes.Clone(good), 'x'), {TagRecord, recordVersion, 0xff}} {
		_, _, _, err := ParseRecord(bad)
		assert.ErrorIs(t, err, ErrMalformed, "%x", bad)
	}
}

func TestIndexKeysSortByTime(t *testing.T) {
	rk := AppendRecord(nil, "t", "e", "k")
	times := []int64{math.MinInt64, -5, 0, 1, 1 << 40, math.MaxInt64}
	for i := 1; i < len(times); i++ {
		a := AppendIndex(nil, TagExpiry, times[i-1], rk)
		b := AppendIndex(nil, TagExpiry, times[i], rk)
		assert.Negative(t, bytes.Compare(a, b), "%d before %d", times[i-1], times[i])
		got, grk, err := ParseIndex(b)
		require.NoError(t, err)
		assert.Equal(t, times[i], got)
		assert.Equal(t, rk, grk)
	}
	assert.Negative(t, bytes.Compare(AppendIndex(nil, TagExpiry, 7, rk), IndexBound(TagExpiry, 8)))
	assert.Positive(t, bytes.Compare(AppendIndex(nil, TagExpiry, 7, rk), IndexBound(TagExpiry, 7)))
}

func TestChunkSpanHoldsOnlyItsRecord(t *testing.T) {
	a := AppendRecord(nil, "t", "e", "k")
	b := AppendRecord(nil, "t", "e", "k2")
	lo, hi := ChunkSpan(a)
	for _, i := range []uint32{0, 1, math.MaxUint32} {
		k := AppendChunk(nil, a, i)
		assert.True(t, bytes.Compare(lo, k) <= 0 && bytes.Compare(k, hi) < 0)
		other := AppendChunk(nil, b, i)
		assert.False(t, bytes.Compare(lo, other) <= 0 && bytes.Compare(other, hi) < 0, "chunk of another record in span")
	}
}
