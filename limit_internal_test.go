package idem

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestBucketsBounded: a million invented tenants leave no more buckets than
// the bound, and the heap grows by no more than limitHeapBound.
func TestBucketsBounded(t *testing.T) {
	const limitHeapBound = 8 << 20 // for DefaultLimitTenants buckets
	o := Limits{ClaimRate: 1, ClaimBurst: 1, Now: time.Now}
	before := heap()
	b := newBuckets(DefaultLimitTenants)
	for i := range 1_000_000 {
		// As long as the proxy's tenants, a SHA-256 in hex.
		b.get(fmt.Sprintf("%064x", i), o).AllowN(o.Now(), 1)
	}
	grown := int64(heap()) - int64(before)
	assert.Equal(t, DefaultLimitTenants, b.len())
	assert.Less(t, grown, int64(limitHeapBound))
	t.Logf("%d buckets after a million tenants: heap grew %d KiB", b.len(), grown>>10)
	runtime.KeepAlive(b)
}

func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestBucketsLeastRecentlyUsedOut: a tenant in use keeps its bucket, empty
// as it is, while invented ones push out each other.
func TestBucketsLeastRecentlyUsedOut(t *testing.T) {
	now := time.Unix(1, 0)
	o := Limits{ClaimRate: 1, ClaimBurst: 1, Now: func() time.Time { return now }}
	b := newBuckets(3)
	assert.True(t, b.get("busy", o).AllowN(now, 1))
	for i := range 10 {
		b.get(fmt.Sprint(i), o)
		assert.False(t, b.get("busy", o).AllowN(now, 1), "the busy tenant's bucket stays empty")
	}
	assert.Equal(t, 3, b.len())
}
