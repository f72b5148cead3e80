package idem

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idem/internal/keys"
)

// counters are the DB's lifetime event counts.
type counters struct {
	claims, replays, conflicts, mismatches, pending atomic.Int64
	completions, releases, unknowns, failures       atomic.Int64
	reconciled                                      atomic.Int64
}

// Metrics is a snapshot of a DB's counters and state. Counts of events are
// since Open; counts of records are of what is stored now.
type Metrics struct {
	// Events since Open.
	Claims      int64 // claims won: operations started
	Replays     int64 // claims answered with a stored response
	Conflicts   int64 // claims refused with ErrInProgress
	Mismatches  int64 // claims refused with ErrFingerprintMismatch
	Pending     int64 // claims refused with ErrOutcomePending
	Completions int64
	Releases    int64
	Unknowns    int64 // leases ended with MarkUnknown
	Failures    int64 // leases ended with MarkFailed
	Reconciled  int64 // overdue records resolved by Options.Reconcile

	// Stored records that are not completed.
	InProgress       int64         // in progress, live lease or not
	Overdue          int64         // in progress past their lease
	OldestInProgress time.Duration // age of the oldest in-progress record
	UnknownRecords   int64
	FailedRecords    int64

	// Expired counts the records past their TTL that the sweeper has not
	// deleted yet. Reads already treat them as absent.
	Expired int64

	// Expiry since Open.
	Swept          int64 // expired records deleted
	BytesReclaimed int64 // their size, body chunks included
	Compactions    int64 // compactions the sweeper ran on swept spans

	// Group commit since Open: Commits/Syncs is how many writes share one
	// WAL sync on average.
	Commits int64
	Syncs   int64

	// Pebble.
	DiskBytes         uint64 // everything the store occupies on disk
	PebbleCompactions int64  // all compactions, automatic ones included
	PebbleFlushes     int64
	ReadAmp           int // sstables a read may have to visit
}

// Metrics returns a snapshot. Its cost grows with the number of records
// that are not completed or have expired unswept (it reads the pending
// index and the due part of the expiry index), not with the size of the
// store.
func (db *DB) Metrics() (Metrics, error) {
	if err := db.enter(); err != nil {
		return Metrics{}, err
	}
	defer db.exit()
	s := &db.stats
	m := Metrics{
		Claims: s.claims.Load(), Replays: s.replays.Load(), Conflicts: s.conflicts.Load(),
		Mismatches: s.mismatches.Load(), Pending: s.pending.Load(), Completions: s.completions.Load(),
		Releases: s.releases.Load(), Unknowns: s.unknowns.Load(), Failures: s.failures.Load(),
		Reconciled: s.reconciled.Load(),
		Commits:    db.commits.commits.Load(), Syncs: db.commits.syncs.Load(),
	}
	sw := db.sweeper.Totals()
	m.Swept, m.BytesReclaimed, m.Compactions = int64(sw.Records), sw.Bytes, int64(sw.Compactions)

	now := db.now()
	err := db.scanPending(time.Unix(0, 1<<63-1), func(e pendingEntry) bool {
		switch e.state {
		case StateInProgress:
			m.InProgress++
			if !now.Before(e.due) {
				m.Overdue++
			}
			m.OldestInProgress = max(m.OldestInProgress, now.Sub(e.created))
		case StateUnknown:
			m.UnknownRecords++
		case StateFailed:
			m.FailedRecords++
		}
		return true
	})
	if err != nil {
		return m, err
	}
	if m.Expired, err = db.countExpired(now); err != nil {
		return m, err
	}
	pm := db.pdb.Metrics()
	m.DiskBytes = pm.DiskSpaceUsage()
	m.PebbleCompactions = pm.Compact.Count
	m.PebbleFlushes = pm.Flush.Count
	m.ReadAmp = pm.ReadAmp()
	return m, nil
}

// countExpired counts the expiry-index entries due by now. Sweeps retire
// the index spans they walk, so every entry left is a record still stored.
func (db *DB) countExpired(now time.Time) (int64, error) {
	it, err := db.pdb.NewIter(&pebble.IterOptions{
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

// Ping reports whether the store can serve reads: it reads one small key,
// so it fails once the DB is closed or Pebble can no longer read, but it
// writes nothing (a write failure ends the process anyway). Health checks
// call it.
func (db *DB) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := db.enter(); err != nil {
		return err
	}
	defer db.exit()
	_, closer, err := db.pdb.Get(keys.Schema)
	if err != nil {
		return fmt.Errorf("idem: read schema version: %w", err)
	}
	return closer.Close()
}
