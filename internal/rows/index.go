package rows

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/record"
)

// Records that are not completed are listed in the pending index ('p'),
// keyed by the end of their lease (or, once they left progress, by when
// they did). Recovery reads that index instead of the whole store: the
// overdue claims are exactly its entries due by now whose state is
// in progress.

// Pending is one entry of the pending index.
type Pending struct {
	RK      []byte     // the record's key
	Due     time.Time  // the end of its lease, or when it left progress
	Created time.Time  // when it was claimed
	State   idem.State // its state
}

// ScanPending calls fn for each pending-index entry due before until, in
// order of due time, until fn returns false.
func (t *Table) ScanPending(until time.Time, fn func(Pending) bool) error {
	lo := keys.IndexBound(keys.TagPending, math.MinInt64)
	hi := keys.IndexBound(keys.TagPending, until.UnixNano())
	it, err := t.pdb.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		due, rk, err := keys.ParseIndex(it.Key())
		created, state, vok := record.ParsePending(it.Value())
		if err != nil || !vok {
			return errors.Join(fmt.Errorf("%w: pending index entry", idem.ErrCorrupt), it.Close())
		}
		e := Pending{RK: append([]byte(nil), rk...), Due: time.Unix(0, due), Created: created, State: state}
		if !fn(e) {
			break
		}
	}
	return errors.Join(it.Error(), it.Close())
}

// CountExpired counts the expiry-index entries due by now. Sweeps retire
// the index spans they walk, so every entry left is a record still stored.
func (t *Table) CountExpired(now time.Time) (int64, error) {
	it, err := t.pdb.NewIter(&pebble.IterOptions{
		LowerBound: keys.IndexBound(keys.TagExpiry, math.MinInt64),
		UpperBound: keys.IndexBound(keys.TagExpiry, now.UnixNano()+1),
	})
	if err != nil {
		return 0, fmt.Errorf("idem: read expiry index: %w", err)
	}
	var n int64
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return 0, fmt.Errorf("idem: read expiry index: %w", err)
	}
	return n, nil
}
