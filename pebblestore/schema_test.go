package pebblestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/record"
	"github.com/idemkv/idem/internal/rows"
)

// storedValue returns a copy of the value stored under k.
func storedValue(t *testing.T, db *Store, k []byte) []byte {
	t.Helper()
	v, closer, err := db.pdb.Get(k)
	require.NoError(t, err)
	defer closer.Close()
	return bytes.Clone(v)
}

func storedSchema(t *testing.T, db *Store) uint64 {
	t.Helper()
	got, _ := binary.Uvarint(storedValue(t, db, keys.Schema))
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
	s := idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "k1"}
	rk := recordKey(s)

	db, err := Open("db", &Options{fs: fs, SweepInterval: -1})
	require.NoError(t, err)
	_, _, err = db.Claim(ctx, s, sha256.Sum256([]byte("a")))
	require.NoError(t, err)
	require.NoError(t, db.FlushMemtable())
	require.NoError(t, db.CompactStore())
	rec, _, err := db.rows.ReadLocked(rk, db.now())
	require.NoError(t, err)
	_, pk := rows.IndexKeys(rk, &rec.Record)
	require.NoError(t, db.pdb.Set(pk, record.PendingValue(&rec.Record), pebble.Sync))
	require.NoError(t, db.pdb.Set(keys.Schema, binary.AppendUvarint(nil, 1), pebble.Sync))
	require.NoError(t, db.FlushMemtable())
	require.NoError(t, db.Close())

	db, err = Open("db", &Options{fs: fs, SweepInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	assert.Equal(t, uint64(schemaVersion), storedSchema(t, db))
	rec, _, err = db.rows.ReadLocked(rk, db.now())
	require.NoError(t, err)
	next := *rec
	next.State, next.LeaseUntil = idem.StateCompleted, db.now()
	next.Response = idem.Response{Status: 201}
	next.BodyDigest = record.BodyDigest(nil)
	_, err = db.rows.WriteLocked(rk, rec, &next, nil)
	require.NoError(t, err)
	require.NoError(t, db.FlushMemtable())
	require.NoError(t, db.CompactStore())
	n, err := db.CountFamily(keys.TagPending)
	require.NoError(t, err)
	assert.Zero(t, n, "a retired pending entry came back")
	RequireConsistent(t, db)
}

// reopenWithSchema opens a fresh store, records schema version v in it,
// and returns what opening it again says.
func reopenWithSchema(t *testing.T, v uint64) error {
	fs := vfs.NewMem()
	db, err := Open("db", &Options{fs: fs, SweepInterval: -1})
	require.NoError(t, err)
	require.NoError(t, db.pdb.Set(keys.Schema, binary.AppendUvarint(nil, v), pebble.Sync))
	require.NoError(t, db.Close())
	db, err = Open("db", &Options{fs: fs, SweepInterval: -1})
	if err == nil {
		db.Close()
	}
	return err
}

// TestSchemaZeroIsCorrupt: no build ever wrote version 0, so it is damage,
// not a store to upgrade.
func TestSchemaZeroIsCorrupt(t *testing.T) {
	require.ErrorIs(t, reopenWithSchema(t, 0), idem.ErrCorrupt)
}

func TestNewerSchemaIsRefused(t *testing.T) {
	require.ErrorContains(t, reopenWithSchema(t, schemaVersion+1), fmt.Sprintf("schema version %d", schemaVersion+1))
}

// asFormat1 rewrites a value of record format 2 whose body is raw as format
// 1 wrote it: the same ten-byte header and payload, without the trailing
// codec field (a zero byte) and with one field fewer in the payload's
// fixarray.
func asFormat1(t *testing.T, v []byte) []byte {
	t.Helper()
	const header, fields = 10, 14
	require.Equal(t, byte(0x90|fields), v[header])
	require.Equal(t, byte(0), v[len(v)-1])
	v1 := bytes.Clone(v[:len(v)-1])
	v1[0], v1[header] = 1, 0x90|(fields-1)
	return v1
}

// TestUpgradeFrom2ReadsItsRecords: a version 2 store holds records of
// formatVersion 1. After the upgrade they replay as before, and new
// completions store their bodies compressed.
func TestUpgradeFrom2ReadsItsRecords(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewMem()
	oldBody := make([]byte, 600) // stored raw, as format 1 stored every body
	rand.NewChaCha8([32]byte{1}).Read(oldBody)
	newBody := bytes.Repeat([]byte(`{"id":"pay_1","amount":4200},`), 20)
	oldKey := idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "old"}
	newKey := idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "new"}
	complete := func(db *Store, s idem.Scope, body []byte) {
		l, _, err := db.Claim(ctx, s, sha256.Sum256(body))
		require.NoError(t, err)
		require.NoError(t, l.Complete(ctx, idem.Response{Status: 201, Body: body}))
	}
	replay := func(db *Store, s idem.Scope, body []byte) {
		_, got, err := db.Claim(ctx, s, sha256.Sum256(body))
		require.NoError(t, err)
		require.NotNil(t, got, "%s was not replayed", s.Key)
		assert.Equal(t, body, got.Response.Body)
	}

	db, err := Open("db", &Options{fs: fs, SweepInterval: -1})
	require.NoError(t, err)
	complete(db, oldKey, oldBody)
	v1 := asFormat1(t, storedValue(t, db, recordKey(oldKey)))
	require.NoError(t, db.pdb.Set(recordKey(oldKey), v1, pebble.Sync))
	require.NoError(t, db.pdb.Set(keys.Schema, binary.AppendUvarint(nil, 2), pebble.Sync))
	require.NoError(t, db.Close())

	db, err = Open("db", &Options{fs: fs, SweepInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	assert.Equal(t, uint64(schemaVersion), storedSchema(t, db))
	require.Equal(t, v1, storedValue(t, db, recordKey(oldKey)), "the upgrade rewrote the old record")
	replay(db, oldKey, oldBody)

	complete(db, newKey, newBody)
	assert.Less(t, len(storedValue(t, db, recordKey(newKey))), len(newBody), "the new record's body is not compressed")
	replay(db, newKey, newBody)
	RequireConsistent(t, db)
}
