package pebblestore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
)

// A wall clock can be wrong: a device without a battery-backed clock
// starts in 1970 or at its build date and steps forward once the network
// is up, and time synchronisation steps clocks back too. Every time a
// record holds comes from Options.Now, so a record written under a clock
// that is behind expires early once the clock is right (and a retry then
// runs the operation again), and its lease ends early too.
//
// So the store keeps a clock mark: the newest clock reading a write has
// used. It lives in memory and under keys.Clock, written in the batches
// the store commits anyway, once the mark has moved on by markStep, so it
// costs no sync of its own and survives a crash up to markStep late.
// Claim and TakeOver refuse with ErrClockBehind while the clock reads
// further behind the mark than Options.ClockTolerance, and change
// nothing. The mark only moves forward, so it follows the clock again
// once the clock has passed it; a mark that a clock wrongly ahead left
// behind is moved back by ResetClockMark, a tool's call.
//
// Everything else goes on under the clock as it reads. Lease calls store
// the outcome of an operation that has run, which matters more than the
// times beside it; Extend never moves a lease's end back. Get, Overdue
// and Metrics only read. A sweep under a clock behind deletes less than
// it could, which is safe. A sweep under a clock that jumped ahead deletes
// records early, and nothing tells such a jump from a store left idle, so
// the sweep logs once when the clock is past the expiry of everything
// written up to the mark.

// markStep is how far the clock mark moves on before a commit writes it
// again.
const markStep = time.Second

// noMark is the mark of a store that has never written one.
const noMark = math.MinInt64

// clockMark is the store's clock mark, in Unix nanoseconds. It is safe
// for concurrent use.
type clockMark struct {
	seen   atomic.Int64 // the newest reading a write has used, or noMark
	stored atomic.Int64 // the newest mark added to a committed batch, or noMark; changed by load and stamp only

	refusing    atomic.Bool  // the last clock check refused; its change of value is logged
	warnedAhead atomic.Int64 // the mark whose passing the sweep last warned about
}

// load reads the stored mark of pdb.
func (m *clockMark) load(pdb *pebble.DB) error {
	mark := int64(noMark)
	v, closer, err := pdb.Get(keys.Clock)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return fmt.Errorf("idem: read clock mark: %w", err)
	default:
		defer closer.Close()
		if len(v) != 8 {
			return fmt.Errorf("%w: unreadable clock mark", idem.ErrCorrupt)
		}
		mark = int64(binary.BigEndian.Uint64(v))
	}
	m.seen.Store(mark)
	m.stored.Store(mark)
	m.warnedAhead.Store(noMark)
	return nil
}

// observe moves the mark on to t, a reading a write is about to use,
// unless it is there already.
func (m *clockMark) observe(t int64) {
	for {
		cur := m.seen.Load()
		if t <= cur || m.seen.CompareAndSwap(cur, t) {
			return
		}
	}
}

// stamp is the group committer's stamp: it adds the mark to b when it has
// moved on by markStep since it was last added. The committer calls it
// for one group at a time, after every write of the group has observed
// its reading, so a durable record is never more than markStep past the
// durable mark.
func (m *clockMark) stamp(b *pebble.Batch) error {
	seen, stored := m.seen.Load(), m.stored.Load()
	if seen <= stored || stored != noMark && seen-stored < int64(markStep) {
		return nil
	}
	if err := b.Set(keys.Clock, binary.BigEndian.AppendUint64(nil, uint64(seen)), nil); err != nil {
		return err
	}
	m.stored.Store(seen)
	return nil
}

// checkClock returns ErrClockBehind, counted as an event of s, when now
// reads further behind the clock mark than Options.ClockTolerance, and
// otherwise moves the mark on to now. It logs the first refusal and the
// first admission after refusals.
func (db *Store) checkClock(s idem.Scope, fp idem.Fingerprint, now, start time.Time) error {
	mark, t := db.clock.seen.Load(), now.UnixNano()
	if mark == noMark || mark-t <= int64(db.opts.ClockTolerance) {
		if db.clock.refusing.Load() && db.clock.refusing.CompareAndSwap(true, false) {
			db.opts.Logger.Warn("idem: the clock is within tolerance of the clock mark again; claims are accepted",
				"clock", now.UTC(), "mark", time.Unix(0, mark).UTC())
		}
		db.clock.observe(t)
		return nil
	}
	behind := time.Duration(mark - t)
	if db.clock.refusing.CompareAndSwap(false, true) {
		db.opts.Logger.Error("idem: the clock is behind the newest time this store has written under; claims are refused until the clock is right",
			"behind", behind, "clock", now.UTC(), "mark", time.Unix(0, mark).UTC(), "tolerance", db.opts.ClockTolerance)
	}
	db.note(idem.EventClockBehind, s, &idem.Record{Scope: s, Fingerprint: fp}, start)
	return fmt.Errorf("%w: the clock reads %s, %s behind the clock mark %s (tolerance %s)",
		idem.ErrClockBehind, now.UTC().Format(time.RFC3339), behind, time.Unix(0, mark).UTC().Format(time.RFC3339), db.opts.ClockTolerance)
}

// warnAhead logs, once per clock mark, a sweep at a time past the expiry
// of every record written up to the mark: a clock that jumped ahead, or a
// store that was left idle for longer than its TTL.
func (db *Store) warnAhead(now time.Time) {
	mark := db.clock.seen.Load()
	if mark == noMark || now.UnixNano()-mark <= int64(db.opts.maxTTL()) || db.clock.warnedAhead.Swap(mark) == mark {
		return
	}
	db.opts.Logger.Warn("idem: the clock is past the expiry of every record written up to the clock mark; "+
		"if it jumped ahead, the sweep deletes those records early",
		"ahead", time.Duration(now.UnixNano()-mark), "clock", now.UTC(), "mark", time.Unix(0, mark).UTC())
}

// ClockMark returns the store's clock mark: the newest clock reading it
// has written under, and false when it has written none.
func (db *Store) ClockMark() (time.Time, bool) {
	mark := db.clock.seen.Load()
	if mark == noMark {
		return time.Time{}, false
	}
	return time.Unix(0, mark), true
}

// ResetClockMark moves the clock mark back to the clock's reading, for a
// mark that a clock wrongly ahead left behind, and returns the new mark.
// Nothing else changes: records written under that clock keep its times,
// so they expire that much later, and a claim still in progress from
// then holds its lease until that clock's time. It is for tools (idem
// clock --reset) run while nothing else uses the store: a write under a
// later reading moves the mark on again.
func (db *Store) ResetClockMark(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	if err := db.enter(); err != nil {
		return time.Time{}, err
	}
	defer db.exit()
	now := db.now()
	t := now.UnixNano()
	// Both values change before the commit, so that its group's stamp
	// does not add the old mark after the new one.
	db.clock.seen.Store(t)
	db.clock.stored.Store(t)
	err := db.commits.Commit(func(b *pebble.Batch) error {
		return b.Set(keys.Clock, binary.BigEndian.AppendUint64(nil, uint64(t)), nil)
	})
	if err != nil {
		return time.Time{}, err
	}
	db.opts.Logger.Warn("idem: clock mark reset to the clock", "mark", now.UTC())
	return now, nil
}
