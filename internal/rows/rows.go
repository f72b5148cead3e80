// Package rows keeps the embedded store's records in Pebble: each record
// under its key, its entries in the expiry and pending indexes, its body
// chunks, the stripe locks that order every access to a record, and the
// key filter that answers most reads of absent keys from memory. The store
// above it (package idem) decides what to write; rows writes it durably,
// through the group committer, and reads it back.
package rows

import (
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/commit"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/record"
)

// Table is the rows of one store. It is safe for concurrent use under the
// stripe discipline its methods state.
type Table struct {
	pdb     *pebble.DB
	commits *commit.Committer
	seed    maphash.Seed
	stripes [NumStripes]Stripe

	filters  atomic.Pointer[filterPair]
	building sync.Mutex    // held by BuildFilter
	refilter chan struct{} // asks FilterLoop for a new build
	stop     <-chan struct{}
	// minFilter is the smallest filter built; tests change it, holding
	// building.
	minFilter int64
	// maxFilter is the most keys a filter may be sized for, 0 for no
	// bound; dropped says the store outgrew it (see BuildFilter).
	maxFilter int64
	dropped   atomic.Bool
}

// New returns the rows of pdb, written through commits. Closing stop ends
// FilterLoop and any filter build. maxFilterBytes bounds the memory of
// one key filter, 0 for no bound; a build holds two.
func New(pdb *pebble.DB, commits *commit.Committer, stop <-chan struct{}, maxFilterBytes int64) *Table {
	t := &Table{pdb: pdb, commits: commits, seed: maphash.MakeSeed(), refilter: make(chan struct{}, 1), stop: stop,
		minFilter: minFilterKeys, maxFilter: filterKeysWithin(maxFilterBytes)}
	t.filters.Store(&filterPair{})
	return t
}

// NumStripes is the number of per-key mutexes. Enough that unrelated keys
// rarely share one at a few hundred concurrent requests.
const NumStripes = 4096

// ChunkBytes is the size of one overflow body chunk.
const ChunkBytes = 64 << 10

// Stripe guards the records whose keys hash to it: every read that must
// see only durable state and every write of such a record holds it.
type Stripe struct {
	sync.Mutex
	// Writes counts the writes made under this stripe; it is guarded by
	// the stripe. A lease that finds it unchanged since its own write
	// knows its record is untouched without reading it back.
	Writes uint64
}

// hash is the hash of a record key that picks its stripe and its filter
// bits.
func (t *Table) hash(rk []byte) uint64 { return maphash.Bytes(t.seed, rk) }

// await returns once whoever held s when it was called has let it go. It
// is a barrier, not a critical section: nothing is read or written while
// s is held.
func (s *Stripe) await() {
	s.Lock()
	defer s.Unlock()
}

// awaitWrites returns once every write that held a stripe when it was
// called has ended, durable or failed. It takes each stripe in turn and
// lets it go at once, so it holds up no write for longer than that.
func (t *Table) awaitWrites() {
	for i := range t.stripes {
		t.stripes[i].await()
	}
}

// Stripe returns the stripe of the record under rk.
func (t *Table) Stripe(rk []byte) *Stripe {
	return &t.stripes[t.hash(rk)%NumStripes]
}

// LockKeys locks the stripes of every record key in rks, each once and in
// ascending order, so two multi-key lockers cannot deadlock.
func (t *Table) LockKeys(rks [][]byte) (unlock func()) {
	idx := make([]uint64, 0, len(rks))
	for _, rk := range rks {
		idx = append(idx, t.hash(rk)%NumStripes)
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	for _, i := range idx {
		t.stripes[i].Lock()
	}
	return func() {
		for _, i := range idx {
			t.stripes[i].Unlock()
		}
	}
}

// Get reads the value stored under k, as GetValue does.
func (t *Table) Get(k []byte) ([]byte, io.Closer, error) { return GetValue(t.pdb, k) }

// GetValue reads the value stored under k in r, as Pebble's Get does. A
// value kept in a blob file is read lazily, and when that read fails
// Pebble's Get returns no value and no error, the error coming only from
// the closer; decoded, the missing value would pass for a corrupt record.
// So when the value is empty, as a record's never is, GetValue closes the
// closer and returns its error.
func GetValue(r pebble.Reader, k []byte) ([]byte, io.Closer, error) {
	v, closer, err := r.Get(k)
	if err != nil || len(v) > 0 {
		return v, closer, err
	}
	if err := closer.Close(); err != nil {
		return nil, nil, err
	}
	return v, io.NopCloser(nil), nil
}

// ReadLocked returns the record stored under rk, or nil if there is none.
// An expired record is returned too (live reports which): callers treat it
// as absent but may need to clean up after it. The caller holds rk's stripe.
func (t *Table) ReadLocked(rk []byte, now time.Time) (rec *record.Stored, live bool, err error) {
	if !t.mayExist(t.hash(rk)) {
		return nil, false, nil
	}
	v, closer, err := t.Get(rk)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("idem: read record: %w", err)
	}
	defer closer.Close()
	rec, err = record.Decode(v)
	if err != nil {
		return nil, false, err
	}
	return rec, now.Before(rec.ExpiresAt), nil
}

// WriteLocked durably replaces old (nil if absent) with rec under rk, with
// the index entries and body chunks that go with each. body, when set, is
// an overflow body to store in chunks rather than in the record. The caller
// holds rk's stripe and must not have changed old since reading it. It
// returns the value it stored.
//
// Only the index entries that change are written: every memtable entry
// costs a skiplist insert on the hot path.
func (t *Table) WriteLocked(rk []byte, old, rec *record.Stored, body []byte) ([]byte, error) {
	rec.Chunks = uint32((len(body) + ChunkBytes - 1) / ChunkBytes)
	v, err := rec.Encode(make([]byte, 0, 256+len(rec.Response.Body)))
	if err != nil {
		return nil, err
	}
	rec.StoredLen = int64(len(v))
	h := t.hash(rk)
	t.stripes[h%NumStripes].Writes++
	t.filterAdd(h, old == nil)
	xk, pk := IndexKeys(rk, &rec.Record)
	var oldX, oldP []byte
	if old != nil {
		oldX, oldP = IndexKeys(rk, &old.Record)
	}
	var pv []byte
	if pk != nil {
		pv = record.PendingValue(&rec.Record)
	}
	return v, t.commits.Commit(func(b *pebble.Batch) error {
		w := batchOps{b: b}
		if old != nil && old.Chunks > 0 {
			w.deleteRange(keys.ChunkSpan(rk))
		}
		for i := uint32(0); i < rec.Chunks; i++ {
			end := min(len(body), int(i+1)*ChunkBytes)
			w.set(keys.AppendChunk(nil, rk, i), body[int(i)*ChunkBytes:end])
		}
		if oldX != nil && !bytes.Equal(oldX, xk) {
			w.delete(oldX)
		}
		if oldX == nil || !bytes.Equal(oldX, xk) {
			w.set(xk, nil)
		}
		if oldP != nil {
			// Retired even when pk is the same key, so that a pending
			// entry is never set twice without a deletion between: see
			// retirePending.
			w.retirePending(oldP)
		}
		if pk != nil {
			w.set(pk, pv)
		}
		w.set(rk, v)
		return w.err
	})
}

// batchOps adds operations to a batch and keeps the first error, so that a
// sequence of writes reads as one.
type batchOps struct {
	b   *pebble.Batch
	err error
}

func (w *batchOps) set(k, v []byte) {
	if w.err == nil {
		w.err = w.b.Set(k, v, nil)
	}
}

func (w *batchOps) delete(k []byte) {
	if w.err == nil {
		w.err = w.b.Delete(k, nil)
	}
}

// retirePending deletes a pending-index entry with a single deletion: it
// and the one set it cancels vanish together at the next flush or
// compaction, instead of leaving a tombstone that compactions carry down
// the levels. Every claim sets an entry and nearly every one is retired
// within moments, so those tombstones were a steady share of compaction
// work. A single deletion is only defined when the key was set once since
// it was last deleted; WriteLocked and deleteAll keep that so by retiring
// the stored entry before any new one is set.
func (w *batchOps) retirePending(pk []byte) {
	if w.err == nil {
		w.err = w.b.SingleDelete(pk, nil)
	}
}

func (w *batchOps) deleteRange(lo, hi []byte) {
	if w.err == nil {
		w.err = w.b.DeleteRange(lo, hi, nil)
	}
}

// IndexKeys returns rec's expiry-index key and, unless it is completed, its
// pending-index key.
func IndexKeys(rk []byte, rec *idem.Record) (xk, pk []byte) {
	xk = keys.AppendIndex(nil, keys.TagExpiry, rec.ExpiresAt.UnixNano(), rk)
	if rec.State != idem.StateCompleted {
		pk = keys.AppendIndex(nil, keys.TagPending, rec.LeaseUntil.UnixNano(), rk)
	}
	return xk, pk
}

// DeleteLocked durably removes rec and everything that belongs to it.
func (t *Table) DeleteLocked(rk []byte, rec *record.Stored) error {
	t.Stripe(rk).Writes++
	return t.commits.Commit(func(b *pebble.Batch) error { return deleteAll(b, rk, rec) })
}

// ExpireLocked adds to b, a batch the caller commits, the removal of rec,
// its index entries and its body chunks. The caller holds rk's stripe
// until b is durable.
func (t *Table) ExpireLocked(b *pebble.Batch, rk []byte, rec *record.Stored) error {
	t.Stripe(rk).Writes++
	return deleteAll(b, rk, rec)
}

// deleteAll adds to b the removal of rec, its index entries and its body
// chunks.
func deleteAll(b *pebble.Batch, rk []byte, rec *record.Stored) error {
	w := batchOps{b: b}
	xk, pk := IndexKeys(rk, &rec.Record)
	w.delete(xk)
	if pk != nil {
		w.retirePending(pk)
	}
	if rec.Chunks > 0 {
		w.deleteRange(keys.ChunkSpan(rk))
	}
	w.delete(rk)
	return w.err
}

// LoadBody reads a completed record's overflow chunks into its response and
// checks them against the stored digest.
func (t *Table) LoadBody(rk []byte, rec *record.Stored) error {
	if rec.Chunks == 0 {
		return nil
	}
	lo, hi := keys.ChunkSpan(rk)
	it, err := t.pdb.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("idem: read body: %w", err)
	}
	body := make([]byte, 0, rec.BodyLen)
	var n uint32
	for ok := it.First(); ok; ok = it.Next() {
		body = append(body, it.Value()...)
		n++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("idem: read body: %w", err)
	}
	if n != rec.Chunks || int64(len(body)) != rec.BodyLen || record.BodyDigest(body) != rec.BodyDigest {
		return fmt.Errorf("%w: body chunks do not match the record", idem.ErrCorrupt)
	}
	rec.Response.Body = body
	return nil
}

// HoldsLocked reports whether the value stored under rk is exactly v. The
// caller holds rk's stripe.
func (t *Table) HoldsLocked(rk, v []byte) (bool, error) {
	got, closer, err := t.Get(rk)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("idem: read record: %w", err)
	}
	defer closer.Close()
	return bytes.Equal(got, v), nil
}
