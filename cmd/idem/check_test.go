package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/pebblestore"
)

func TestCheckSoundStore(t *testing.T) {
	dir := seededDir(t)
	r := runIdem(t, "", "check", "--data", dir)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "checked 7 records, 7 expiry entries, 4 pending entries, 2 body chunks: no problems\n", r.stdout)
	assert.Empty(t, r.stderr)

	r = runIdem(t, "", "check", "--data", dir, "--json")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Empty(t, r.stdout)
	assert.Equal(t, "checked 7 records, 7 expiry entries, 4 pending entries, 2 body chunks: no problems\n", r.stderr)
}

// breakStore damages a seeded store the way a bug or a bad disk could,
// writing to Pebble behind idem's back: the completed record loses its
// expiry entry, the stuck one's value is garbled, and a chunk of a record
// that does not exist appears.
func breakStore(t *testing.T, dir string) {
	t.Helper()
	pdb, err := pebble.Open(dir, &pebble.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, pdb.Close()) }()

	rk := func(s idem.Scope) []byte { return keys.AppendRecord(nil, s.Tenant, s.Endpoint, s.Key) }
	lo, hi := keys.FamilySpan(keys.TagExpiry)
	it, err := pdb.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	require.NoError(t, err)
	var expiry []byte
	for ok := it.First(); ok; ok = it.Next() {
		if _, k, err := keys.ParseIndex(it.Key()); err == nil && bytes.Equal(k, rk(seeded.completed)) {
			expiry = bytes.Clone(it.Key())
		}
	}
	require.NoError(t, it.Close())
	require.NotNil(t, expiry, "no expiry entry for the completed record")

	b := pdb.NewBatch()
	require.NoError(t, b.Delete(expiry, nil))
	require.NoError(t, b.Set(rk(seeded.stuck), []byte("garbled"), nil))
	gone := idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "key-gone-77ab88cd"}
	require.NoError(t, b.Set(keys.AppendChunk(nil, rk(gone), 0), []byte("orphan"), nil))
	require.NoError(t, b.Commit(pebble.Sync))
}

func TestCheckFindsEveryProblem(t *testing.T) {
	dir := seededDir(t)
	breakStore(t, dir)
	gone := idem.KeyHash("key-gone-77ab88cd")

	r := runIdem(t, "", "check", "--data", dir)
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Empty(t, r.stderr)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, 4, r.stdout)
	assert.Regexp(t, `^chunks_orphaned tenant="acme" endpoint="POST /v1/payments" key_hash=`+gone+`: `, lines[0])
	assert.Regexp(t, `^record_undecodable tenant="acme" endpoint="POST /v1/payments" key_hash=`+idem.KeyHash(seeded.stuck.Key)+`: `, lines[1])
	assert.Regexp(t, `^expiry_missing tenant="acme" endpoint="POST /v1/payments" key_hash=`+idem.KeyHash(seeded.completed.Key)+`: `, lines[2])
	assert.Equal(t, "checked 7 records, 6 expiry entries, 4 pending entries, 3 body chunks: 3 problems", lines[3])
	for _, k := range append(allKeys(), "key-gone-77ab88cd") {
		assert.NotContains(t, r.stdout, k, "a raw key in the output")
	}

	r = runIdem(t, "", "check", "--data", dir, "--json")
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Equal(t, "checked 7 records, 6 expiry entries, 4 pending entries, 3 body chunks: 3 problems\n", r.stderr)
	var got []pebblestore.Problem
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var p pebblestore.Problem
		require.NoError(t, json.Unmarshal(sc.Bytes(), &p), sc.Text())
		assert.NotEmpty(t, p.Detail)
		got = append(got, pebblestore.Problem{Kind: p.Kind, Tenant: p.Tenant, Endpoint: p.Endpoint, KeyHash: p.KeyHash})
	}
	assert.Equal(t, []pebblestore.Problem{
		{Kind: pebblestore.ProblemChunksOrphaned, Tenant: "acme", Endpoint: "POST /v1/payments", KeyHash: gone},
		{Kind: pebblestore.ProblemRecordUndecodable, Tenant: "acme", Endpoint: "POST /v1/payments", KeyHash: idem.KeyHash(seeded.stuck.Key)},
		{Kind: pebblestore.ProblemExpiryMissing, Tenant: "acme", Endpoint: "POST /v1/payments", KeyHash: idem.KeyHash(seeded.completed.Key)},
	}, got)
	for _, k := range append(allKeys(), "key-gone-77ab88cd") {
		assert.NotContains(t, r.stdout, k, "a raw key in the output")
	}
}
