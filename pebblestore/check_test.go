package pebblestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/record"
	"github.com/idemkv/idem/internal/rows"
)

// checkFixture is a store for Check's tests: a clock that stands still and
// bodies over 1 KiB stored in chunks.
type checkFixture struct {
	t   *testing.T
	db  *Store
	now time.Time
}

func newCheckFixture(t *testing.T) *checkFixture {
	f := &checkFixture{t: t, now: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
	db, err := Open("db", &Options{fs: vfs.NewMem(), SweepInterval: -1, InlineBodyBytes: 1 << 10,
		Now: func() time.Time { return f.now }})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	f.db = db
	return f
}

func checkScope(key string) idem.Scope {
	return idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: key}
}

// claim claims key and returns the lease.
func (f *checkFixture) claim(key string) idem.Lease {
	f.t.Helper()
	l, rec, err := f.db.Claim(context.Background(), checkScope(key), sha256.Sum256([]byte(key)))
	require.NoError(f.t, err)
	require.Nil(f.t, rec)
	return l
}

// complete claims key and completes it with body.
func (f *checkFixture) complete(key string, body []byte) {
	f.t.Helper()
	require.NoError(f.t, f.claim(key).Complete(context.Background(), idem.Response{Status: 201, Body: body}))
}

// stored returns the record of key as stored, with its record key.
func (f *checkFixture) stored(key string) ([]byte, *record.Stored) {
	f.t.Helper()
	rk := recordKey(checkScope(key))
	rec, _, err := f.db.rows.ReadLocked(rk, f.now)
	require.NoError(f.t, err)
	require.NotNil(f.t, rec)
	return rk, rec
}

// The raw writes below go around the store, as a bug or a damaged disk
// would.
func (f *checkFixture) set(k, v []byte) { require.NoError(f.t, f.db.pdb.Set(k, v, pebble.Sync)) }
func (f *checkFixture) del(k []byte)    { require.NoError(f.t, f.db.pdb.Delete(k, pebble.Sync)) }

func (f *checkFixture) check() CheckResult {
	f.t.Helper()
	res, err := f.db.Check(context.Background())
	require.NoError(f.t, err)
	return res
}

// chunked is a body stored in three chunks.
var chunked = bytes.Repeat([]byte("0123456789abcdef"), (2*rows.ChunkBytes+100)/16)

func TestCheckPassesASoundStore(t *testing.T) {
	f := newCheckFixture(t)
	f.claim("in-progress")
	f.complete("inline", []byte(`{"id":"pay_1"}`))
	f.complete("empty", nil)
	f.complete("chunked", chunked)
	f.complete("compressed", bytes.Repeat([]byte("a"), 900))
	require.NoError(t, f.claim("unknown").MarkUnknown(context.Background()))
	require.NoError(t, f.claim("failed").MarkFailed(context.Background()))
	l := f.claim("extended")
	f.now = f.now.Add(time.Second)
	require.NoError(t, l.Extend(context.Background()))
	require.NoError(t, f.claim("released").Release(context.Background()))
	f.now = f.now.Add(30 * 24 * time.Hour) // all expired, none swept yet

	res := f.check()
	assert.True(t, res.OK(), "%v", res.Problems)
	assert.Equal(t, CheckResult{Records: 8, ExpiryEntries: 8, PendingEntries: 4, Chunks: 3}, res)

	_, err := f.db.Sweep(context.Background())
	require.NoError(t, err)
	assert.Equal(t, CheckResult{}, f.check())
}

// TestCheckReportsEveryProblem breaks a store in every way Check knows,
// each on its own record, and expects one Check to report all of them.
func TestCheckReportsEveryProblem(t *testing.T) {
	f := newCheckFixture(t)
	for _, k := range []string{"sound", "no-expiry", "moved-expiry", "garbled", "chunk-lost", "chunk-altered"} {
		f.complete(k, chunked)
	}
	f.complete("stray-chunk", []byte("small"))
	f.complete("stray-pending", []byte("ok"))
	for _, k := range []string{"no-pending", "pending-says-unknown", "pending-unreadable"} {
		f.claim(k)
	}
	type want struct {
		kind ProblemKind
		key  string // "" for a problem that names no record
	}
	var wants []want
	expect := func(kind ProblemKind, key string) { wants = append(wants, want{kind, key}) }

	rk, rec := f.stored("no-expiry")
	f.del(keys.AppendIndex(nil, keys.TagExpiry, rec.ExpiresAt.UnixNano(), rk))
	expect(ProblemExpiryMissing, "no-expiry")

	rk, rec = f.stored("moved-expiry")
	f.del(keys.AppendIndex(nil, keys.TagExpiry, rec.ExpiresAt.UnixNano(), rk))
	f.set(keys.AppendIndex(nil, keys.TagExpiry, rec.ExpiresAt.Add(time.Hour).UnixNano(), rk), nil)
	expect(ProblemExpiryMissing, "moved-expiry")
	expect(ProblemExpiryStale, "moved-expiry")

	rk, _ = f.stored("garbled")
	// Record format 2's header, then a byte msgpack never writes.
	f.set(rk, []byte{2, byte(idem.StateCompleted), 0, 0, 0, 0, 0, 0, 0, 0, 0xc1})
	expect(ProblemRecordUndecodable, "garbled")

	rk, _ = f.stored("chunk-lost")
	f.del(keys.AppendChunk(nil, rk, 1))
	expect(ProblemChunksMismatch, "chunk-lost")

	rk, _ = f.stored("chunk-altered")
	f.set(keys.AppendChunk(nil, rk, 2), []byte("not the body"))
	expect(ProblemBodyMismatch, "chunk-altered")

	rk, _ = f.stored("stray-chunk")
	f.set(keys.AppendChunk(nil, rk, 0), []byte("left over"))
	expect(ProblemChunksMismatch, "stray-chunk")

	rk, rec = f.stored("stray-pending")
	f.set(keys.AppendIndex(nil, keys.TagPending, rec.LeaseUntil.UnixNano(), rk), record.PendingValue(&rec.Record))
	expect(ProblemPendingStale, "stray-pending")

	rk, rec = f.stored("no-pending")
	f.del(keys.AppendIndex(nil, keys.TagPending, rec.LeaseUntil.UnixNano(), rk))
	expect(ProblemPendingMissing, "no-pending")

	rk, rec = f.stored("pending-says-unknown")
	other := rec.Record
	other.State = idem.StateUnknown
	f.set(keys.AppendIndex(nil, keys.TagPending, rec.LeaseUntil.UnixNano(), rk), record.PendingValue(&other))
	expect(ProblemPendingStale, "pending-says-unknown")

	rk, rec = f.stored("pending-unreadable")
	f.set(keys.AppendIndex(nil, keys.TagPending, rec.LeaseUntil.UnixNano(), rk), []byte{1, 2, 3})
	expect(ProblemIndexMalformed, "pending-unreadable")

	// Entries and chunks of records that were never written.
	gone := recordKey(checkScope("gone"))
	f.set(keys.AppendIndex(nil, keys.TagExpiry, f.now.UnixNano(), gone), nil)
	expect(ProblemExpiryOrphaned, "gone")
	f.set(keys.AppendIndex(nil, keys.TagPending, f.now.UnixNano(), gone), record.PendingValue(&rec.Record))
	expect(ProblemPendingOrphaned, "gone")
	f.set(keys.AppendChunk(nil, gone, 0), []byte("a"))
	f.set(keys.AppendChunk(nil, gone, 1), []byte("b"))
	expect(ProblemChunksOrphaned, "gone")

	// Keys that name no record at all.
	f.set([]byte{keys.TagRecord, 0x01, 0xff}, []byte("?"))
	expect(ProblemRecordKey, "")
	f.set([]byte{keys.TagExpiry, 1, 2}, nil)
	expect(ProblemIndexMalformed, "")
	f.set([]byte("zebra"), []byte("?"))
	expect(ProblemUnknownKey, "")
	f.set([]byte("mystery"), []byte("?"))
	expect(ProblemUnknownKey, "")

	res := f.check()
	var got []want
	for _, p := range res.Problems {
		w := want{kind: p.Kind}
		if p.KeyHash != "" {
			assert.Equal(t, "acme", p.Tenant)
			assert.Equal(t, "POST /v1/payments", p.Endpoint)
			for _, k := range []string{"no-expiry", "moved-expiry", "garbled", "chunk-lost", "chunk-altered", "stray-chunk",
				"stray-pending", "no-pending", "pending-says-unknown", "pending-unreadable", "gone"} {
				if p.KeyHash == idem.KeyHash(k) {
					w.key = k
				}
			}
			assert.NotEmpty(t, w.key, "problem about an unexpected record: %s", p)
		}
		got = append(got, w)
		assert.NotEmpty(t, p.Detail)
	}
	assert.ElementsMatch(t, wants, got, "problems:\n%s", problemLines(res.Problems))
	assert.Equal(t, 12, res.Records)
	assert.False(t, res.OK())
}

func problemLines(ps []Problem) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintln(&b, p)
	}
	return b.String()
}

// TestCheckDetailsHoldNoKey breaks records whose keys are easy to spot and
// looks for them in everything Check says.
func TestCheckDetailsHoldNoKey(t *testing.T) {
	f := newCheckFixture(t)
	const secret = "sk_live_4f8c2a1e9b"
	f.complete(secret, chunked)
	rk, rec := f.stored(secret)
	f.del(keys.AppendIndex(nil, keys.TagExpiry, rec.ExpiresAt.UnixNano(), rk))
	f.del(keys.AppendChunk(nil, rk, 0))
	f.set(keys.AppendIndex(nil, keys.TagPending, 0, rk), nil)
	lost := recordKey(checkScope(secret + "-lost"))
	f.set(keys.AppendChunk(nil, lost, 0), nil)
	f.set(keys.AppendIndex(nil, keys.TagExpiry, 0, lost[:len(lost)-1]), nil) // a record key cut short
	f.set(append([]byte{keys.TagRecord, 0x01}, secret...), []byte("?"))
	f.set(append([]byte("q"), secret...), nil)

	res := f.check()
	require.Len(t, res.Problems, 7, problemLines(res.Problems))
	for _, p := range res.Problems {
		assert.NotContains(t, p.String(), "sk_live", "a raw key in %s", p)
	}
}

func TestCheckStopsWithItsContext(t *testing.T) {
	f := newCheckFixture(t)
	for i := range checkEvery {
		f.claim(fmt.Sprint("k", i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := f.db.Check(ctx)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestCheckAfterClose(t *testing.T) {
	f := newCheckFixture(t)
	require.NoError(t, f.db.Close())
	_, err := f.db.Check(context.Background())
	assert.ErrorIs(t, err, idem.ErrClosed)
}

// TestCheckWhileWriting runs Check while claims, completions, releases and
// sweeps go on: it reads one snapshot, and every write is one batch, so
// it must never see a record apart from its entries.
func TestCheckWhileWriting(t *testing.T) {
	// Each reading of the clock moves it on a second, so that leases run
	// out and records expire while the writers go on.
	var clock sync.Mutex
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	db, err := Open("db", &Options{fs: vfs.NewMem(), SweepInterval: -1, InlineBodyBytes: 1 << 10,
		Lease: 5 * time.Second, TTL: time.Minute, Now: func() time.Time {
			clock.Lock()
			defer clock.Unlock()
			now = now.Add(time.Second)
			return now
		}})
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				s := checkScope(fmt.Sprintf("w%d-%d", w, i%50))
				l, _, err := db.Claim(ctx, s, idem.Fingerprint{byte(w)})
				if err != nil || l == nil {
					continue
				}
				switch i % 4 {
				case 0:
					l.Complete(ctx, idem.Response{Status: 200, Body: chunked})
				case 1:
					l.Release(ctx)
				case 2:
					l.MarkUnknown(ctx)
				default:
					l.Complete(ctx, idem.Response{Status: 201, Body: []byte("ok")})
				}
				if i%25 == 0 {
					db.Sweep(ctx)
				}
			}
		})
	}
	writing := make(chan struct{})
	go func() { wg.Wait(); close(writing) }()
	checks, records := 0, 0
	for done := false; !done; {
		select {
		case <-writing:
			done = true
		default:
		}
		res, err := db.Check(ctx)
		require.NoError(t, err)
		assert.Empty(t, res.Problems, problemLines(res.Problems))
		checks++
		records += res.Records
	}
	t.Logf("%d checks saw %d records in all", checks, records)
	assert.Greater(t, checks, 1)
	assert.NotZero(t, records, "Check never saw a record")
	RequireConsistent(t, db)
}
