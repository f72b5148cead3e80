package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/keys"
)

func storedSchema(t *testing.T, db *DB) uint64 {
	t.Helper()
	v, closer, err := db.pdb.Get(keys.Schema)
	require.NoError(t, err)
	defer closer.Close()
	got, _ := binary.Uvarint(v)
	return got
}

// TestUpgradeFrom1LeavesOneSetPerPendingKey forges what version 1 could
// leave: a pending entry set twice, the first write in the last level and
// the second in L0. After the upgrade, retiring the entry must retire it
// for good; without it, compaction cancels the single deletion against
// the second write and brings back the first.
func TestUpgradeFrom1LeavesOneSetPerPendingKey(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewMem()
	s := Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "k1"}
	rk := s.recordKey()

	db, err := Open("db", &Options{FS: fs, SweepInterval: -1})
	require.NoError(t, err)
	_, _, err = db.Claim(ctx, s, sha256.Sum256([]byte("a")))
	require.NoError(t, err)
	require.NoError(t, db.FlushMemtable())
	require.NoError(t, db.CompactStore())
	rec, _, err := db.readLocked(rk, db.now())
	require.NoError(t, err)
	_, pk := indexKeys(rk, rec)
	require.NoError(t, db.pdb.Set(pk, pendingValue(rec), pebble.Sync))
	require.NoError(t, db.pdb.Set(keys.Schema, binary.AppendUvarint(nil, 1), pebble.Sync))
	require.NoError(t, db.FlushMemtable())
	require.NoError(t, db.Close())

	db, err = Open("db", &Options{FS: fs, SweepInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	assert.Equal(t, uint64(schemaVersion), storedSchema(t, db))
	rec, _, err = db.readLocked(rk, db.now())
	require.NoError(t, err)
	next := *rec
	next.State, next.LeaseUntil = StateCompleted, db.now()
	next.Response = Response{Status: 201}
	_, err = db.writeLocked(rk, rec, &next, nil)
	require.NoError(t, err)
	require.NoError(t, db.FlushMemtable())
	require.NoError(t, db.CompactStore())
	n, err := db.CountFamily(keys.TagPending)
	require.NoError(t, err)
	assert.Zero(t, n, "a retired pending entry came back")
	require.NoError(t, db.CheckConsistency())
}

func TestNewerSchemaIsRefused(t *testing.T) {
	fs := vfs.NewMem()
	db, err := Open("db", &Options{FS: fs, SweepInterval: -1})
	require.NoError(t, err)
	require.NoError(t, db.pdb.Set(keys.Schema, binary.AppendUvarint(nil, schemaVersion+1), pebble.Sync))
	require.NoError(t, db.Close())
	_, err = Open("db", &Options{FS: fs, SweepInterval: -1})
	require.ErrorContains(t, err, "schema version 3")
}
