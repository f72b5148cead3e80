package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
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

// TestSchemaZeroIsCorrupt: no build ever wrote version 0, so it is damage,
// not a store to upgrade.
func TestSchemaZeroIsCorrupt(t *testing.T) {
	fs := vfs.NewMem()
	db, err := Open("db", &Options{FS: fs, SweepInterval: -1})
	require.NoError(t, err)
	require.NoError(t, db.pdb.Set(keys.Schema, binary.AppendUvarint(nil, 0), pebble.Sync))
	require.NoError(t, db.Close())
	_, err = Open("db", &Options{FS: fs, SweepInterval: -1})
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestNewerSchemaIsRefused(t *testing.T) {
	fs := vfs.NewMem()
	db, err := Open("db", &Options{FS: fs, SweepInterval: -1})
	require.NoError(t, err)
	require.NoError(t, db.pdb.Set(keys.Schema, binary.AppendUvarint(nil, schemaVersion+1), pebble.Sync))
	require.NoError(t, db.Close())
	_, err = Open("db", &Options{FS: fs, SweepInterval: -1})
	require.ErrorContains(t, err, fmt.Sprintf("schema version %d", schemaVersion+1))
}

// TestUpgradeFrom2ReadsItsRecords: a version 2 store holds records of
// formatVersion 1. After the upgrade they replay as before, and new
// completions store their bodies compressed.
func TestUpgradeFrom2ReadsItsRecords(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewMem()
	oldBody := randomBytes(600) // stored raw, as format 1 stored every body
	newBody := bytes.Repeat([]byte(`{"id":"pay_1","amount":4200},`), 20)
	oldKey := Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "old"}
	newKey := Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "new"}
	complete := func(db *DB, s Scope, body []byte) {
		l, _, err := db.Claim(ctx, s, sha256.Sum256(body))
		require.NoError(t, err)
		require.NoError(t, l.Complete(ctx, Response{Status: 201, Body: body}))
	}
	replay := func(db *DB, s Scope, body []byte) {
		_, got, err := db.Claim(ctx, s, sha256.Sum256(body))
		require.NoError(t, err)
		require.NotNil(t, got, "%s was not replayed", s.Key)
		assert.Equal(t, body, got.Response.Body)
	}
	stored := func(db *DB, s Scope) []byte {
		v, closer, err := db.pdb.Get(s.recordKey())
		require.NoError(t, err)
		defer closer.Close()
		return append([]byte(nil), v...)
	}

	db, err := Open("db", &Options{FS: fs, SweepInterval: -1})
	require.NoError(t, err)
	complete(db, oldKey, oldBody)
	v1 := asFormat1(t, stored(db, oldKey))
	require.NoError(t, db.pdb.Set(oldKey.recordKey(), v1, pebble.Sync))
	require.NoError(t, db.pdb.Set(keys.Schema, binary.AppendUvarint(nil, 2), pebble.Sync))
	require.NoError(t, db.Close())

	db, err = Open("db", &Options{FS: fs, SweepInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	assert.Equal(t, uint64(schemaVersion), storedSchema(t, db))
	require.Equal(t, v1, stored(db, oldKey), "the upgrade rewrote the old record")
	replay(db, oldKey, oldBody)

	complete(db, newKey, newBody)
	assert.Less(t, len(stored(db, newKey)), len(newBody), "the new record's body is not compressed")
	replay(db, newKey, newBody)
	require.NoError(t, db.CheckConsistency())
}
