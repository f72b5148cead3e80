package pebblestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

// TestChunkedBodiesAreCompressedOnDisk: bodies too large to live in the
// record are stored in chunks as they came, which Pebble separates into
// blob files and compresses there (see Open).
func TestChunkedBodiesAreCompressedOnDisk(t *testing.T) {
	ctx := context.Background()
	db, err := Open("db", &Options{fs: vfs.NewMem(), SweepInterval: -1})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	var raw int64
	for i := range 8 {
		body := bytes.Repeat(fmt.Appendf(nil, `{"id":"li_%d","amount":4200},`, i), 8<<10)
		raw += int64(len(body))
		l, _, err := db.Claim(ctx, bodyScope(i), sha256.Sum256([]byte{byte(i)}))
		require.NoError(t, err)
		require.NoError(t, l.Complete(ctx, idem.Response{Status: 201, Body: body}))
		require.Positive(t, l.(*lease).rec.Chunks, "the body was not chunked")
	}
	require.NoError(t, db.FlushMemtable())
	m := db.pdb.Metrics()
	require.Positive(t, m.BlobFiles.LiveCount, "the chunks were not separated from the tables")
	stored := int64(m.Total().TablesSize) + int64(m.BlobFiles.LiveSize)
	assert.Less(t, stored, raw/4, "tables and blob files hold %d bytes for %d bytes of bodies", stored, raw)
}

// TestBlockCacheKeepsBlocks: a record read back from a table is cached,
// even when the cache is no larger than what the memtables take of it
// (see Open): 256 KiB is the size of Pebble's first memtable.
func TestBlockCacheKeepsBlocks(t *testing.T) {
	ctx := context.Background()
	db, err := Open("db", &Options{fs: vfs.NewMem(), SweepInterval: -1, CacheBytes: 256 << 10})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	for i := range 50 {
		l, _, err := db.Claim(ctx, bodyScope(i), idem.Fingerprint{1})
		require.NoError(t, err)
		require.NoError(t, l.Complete(ctx, idem.Response{Status: 201, Body: []byte("paid")}))
	}
	require.NoError(t, db.FlushMemtable())
	for range 3 {
		_, err := db.Get(ctx, bodyScope(8))
		require.NoError(t, err)
	}
	m := db.pdb.Metrics()
	assert.Positive(t, m.BlockCache.Hits, "no read was served from the cache")
	assert.Positive(t, m.BlockCache.Size, "the cache holds nothing")
}

func bodyScope(i int) idem.Scope {
	return idem.Scope{Tenant: fmt.Sprintf("t%d", i%7), Endpoint: "POST /v1/payments", Key: fmt.Sprintf("key-%d", i)}
}
