// Package compaction is idem's TTL compaction filter. Pebble has no hook
// that drops expired values during compaction, so expiry is done in three
// steps: reads ignore expired records (in the idem package), the Sweeper
// walks the expiry index and deletes what has expired, and once enough
// bytes have been swept it compacts the spans it cleared so that the space
// really leaves the disk.
package compaction

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idem/internal/keys"
)

// chunkEntries bounds how many records one sweep step deletes, and so how
// many stripe locks it holds at once and how large its batch grows.
const chunkEntries = 128

// Sweeper deletes expired records. Its fields are set once by the database
// that owns the records; it is safe for concurrent use, and sweeps are
// serialized.
type Sweeper struct {
	DB *pebble.DB
	// Lock locks whatever guards the given record keys against
	// concurrent writers and returns the function that unlocks them.
	Lock func(rks [][]byte) (unlock func())
	// Commit durably applies the operations fill adds, atomically.
	Commit func(fill func(*pebble.Batch) error) error
	// Expire adds to b the deletion of the record stored under rk, with
	// everything that belongs to it, if it has expired by now (Unix ns). It returns the bytes the record occupied,
	// body chunks included, or 0 if it did not delete it. The caller holds
	// rk's lock. done, when not nil, is called once the deletion is
	// durable, for whatever must not be said before (a log event).
	Expire func(b *pebble.Batch, rk []byte, now int64) (size int64, done func(), err error)
	// CompactBytes is how many swept bytes trigger a compaction of the
	// swept spans. Zero compacts after every sweep that deleted anything.
	CompactBytes int64

	mu sync.Mutex // serializes sweeps; guards the fields below
	// owed counts bytes swept since the last compaction; lo and hi bound
	// the record keys they came from, and xhi the expiry index swept.
	owed   int64
	lo, hi []byte
	xhi    []byte

	records     atomic.Int64
	bytes       atomic.Int64
	compactions atomic.Int64
}

// Result says what one Sweep did.
type Result struct {
	Records     int   // records deleted
	Bytes       int64 // their size, chunks included
	Compactions int   // compactions run on swept spans
}

// Totals returns what every sweep so far has done.
func (s *Sweeper) Totals() Result {
	return Result{Records: int(s.records.Load()), Bytes: s.bytes.Load(), Compactions: int(s.compactions.Load())}
}

type entry struct{ xk, rk []byte }

// families are the key families CompactAll compacts: all but the schema
// marker.
var families = []byte{keys.TagBody, keys.TagPending, keys.TagRecord, keys.TagExpiry}

// Sweep deletes every record that expired by now (Unix ns), in steps of a
// bounded size, then compacts the swept spans if enough bytes are owed.
// progress, when not nil, is called after each step with the number of
// expiry-index entries walked so far.
//
// Each step deletes its records, their other index entries and body chunks,
// and the whole expiry-index span it walked, in one batch under the records'
// locks. Retiring the span with one range deletion is safe because a new
// claim's expiry lies after its own clock reading plus a positive TTL, so
// it can never land in a span that already ended at or before now.
func (s *Sweeper) Sweep(ctx context.Context, now int64, progress func(walked int)) (Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var res Result
	walked := 0
	lo := keys.IndexBound(keys.TagExpiry, math.MinInt64)
	hi := keys.IndexBound(keys.TagExpiry, now+1)
	if now == math.MaxInt64 {
		_, hi = keys.FamilySpan(keys.TagExpiry)
	}
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		batch, err := s.scan(lo, hi)
		if err != nil || len(batch) == 0 {
			return res, errors.Join(err, s.maybeCompact(ctx, &res))
		}
		end := append(bytes.Clone(batch[len(batch)-1].xk), 0)
		if err := s.step(batch, end, now, &res); err != nil {
			return res, err
		}
		lo = end
		if walked += len(batch); progress != nil {
			progress(walked)
		}
	}
}

// scan reads up to chunkEntries expiry-index entries in [lo, hi).
func (s *Sweeper) scan(lo, hi []byte) ([]entry, error) {
	it, err := s.DB.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	var out []entry
	for ok := it.First(); ok && len(out) < chunkEntries; ok = it.Next() {
		xk := bytes.Clone(it.Key())
		_, rk, err := keys.ParseIndex(xk)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("compaction: expiry index: %w", err), it.Close())
		}
		out = append(out, entry{xk: xk, rk: rk})
	}
	return out, errors.Join(it.Error(), it.Close())
}

// step deletes the expired records among batch, and the entries of batch
// whose record it did not delete (stale or orphaned). It deletes those
// entries one by one, never the span they lie in: a writer of a key that
// is not in batch, whose stripe step does not hold, may have put an entry
// in that span since the scan, and a range deletion would take it from
// under a record that is still stored.
func (s *Sweeper) step(batch []entry, end []byte, now int64, res *Result) error {
	rks := make([][]byte, len(batch))
	for i, e := range batch {
		rks[i] = e.rk
	}
	unlock := s.Lock(rks)
	defer unlock()
	b := s.DB.NewBatch()
	defer b.Close()
	var n int
	var freed int64
	var dones []func()
	for _, e := range batch {
		size, done, err := s.Expire(b, e.rk, now)
		if err != nil {
			return err
		}
		if done != nil {
			dones = append(dones, done)
		}
		if size == 0 {
			if err := b.Delete(e.xk, nil); err != nil {
				return err
			}
			continue
		}
		n++
		freed += size
		s.widen(e.rk)
	}
	if err := s.Commit(func(gb *pebble.Batch) error { return gb.Apply(b, nil) }); err != nil {
		return err
	}
	for _, done := range dones {
		done()
	}
	s.xhi = end
	s.owed += freed
	res.Records += n
	res.Bytes += freed
	s.records.Add(int64(n))
	s.bytes.Add(freed)
	return nil
}

// widen grows the span of record keys owed a compaction to include rk.
func (s *Sweeper) widen(rk []byte) {
	if s.lo == nil || bytes.Compare(rk, s.lo) < 0 {
		s.lo = bytes.Clone(rk)
	}
	if s.hi == nil || bytes.Compare(rk, s.hi) > 0 {
		s.hi = bytes.Clone(rk)
	}
}

// maybeCompact compacts the record, body-chunk and expiry-index spans that
// sweeps cleared, once they owe enough bytes. Compacting pushes the
// tombstones down to the bottom of the LSM, where they and the values they
// cover are dropped.
func (s *Sweeper) maybeCompact(ctx context.Context, res *Result) error {
	if s.lo == nil || s.owed < s.CompactBytes {
		return nil
	}
	chunkLo, _ := keys.ChunkSpan(s.lo)
	_, chunkHi := keys.ChunkSpan(s.hi)
	xlo, _ := keys.FamilySpan(keys.TagExpiry)
	spans := [][2][]byte{
		{s.lo, append(bytes.Clone(s.hi), 0)},
		{chunkLo, chunkHi},
		{xlo, s.xhi},
	}
	for _, sp := range spans {
		if err := s.DB.Compact(ctx, sp[0], sp[1], false); err != nil {
			return fmt.Errorf("compaction: compact swept span: %w", err)
		}
		res.Compactions++
		s.compactions.Add(1)
	}
	s.owed, s.lo, s.hi = 0, nil, nil
	return nil
}

// CompactAll compacts every key family in turn, whatever is owed, calling
// progress, when not nil, after each with how many are done out of how
// many, and returns how many compactions it ran. Tools call it to return
// the space of swept records to the disk at once.
func (s *Sweeper) CompactAll(ctx context.Context, progress func(done, total int)) (compactions int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, tag := range families {
		lo, hi := keys.FamilySpan(tag)
		if err := s.DB.Compact(ctx, lo, hi, true); err != nil {
			return i, fmt.Errorf("compaction: compact %q family: %w", tag, err)
		}
		s.compactions.Add(1)
		if progress != nil {
			progress(i+1, len(families))
		}
	}
	s.owed, s.lo, s.hi = 0, nil, nil
	return len(families), nil
}
