package pebblestore

import (
	"context"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
)

// Expiry works in three layers, so that correctness never waits for
// cleanup:
//
//  1. Reads filter: Claim and Get treat a record whose ExpiresAt is not
//     after now as absent (rows.Table.ReadLocked).
//  2. Sweeps delete: the compaction package walks the expiry index and
//     deletes each expired record with its index entries and body chunks,
//     under the records' stripe locks (expireLocked below).
//  3. Compaction reclaims: once enough bytes are swept, the swept spans are
//     compacted so the space leaves the disk.

// Sweep deletes every record that has expired by now and, once
// Options.CompactBytes have been swept, compacts the cleared spans. The
// background loop calls it every Options.SweepInterval; tests and tools
// call it directly. It goes by the clock as it reads: behind, it deletes
// less; ahead, it deletes records early, and it logs when the clock is
// past the expiry of everything the store has written.
func (db *Store) Sweep(ctx context.Context) (idem.SweepResult, error) {
	if err := db.enter(); err != nil {
		return idem.SweepResult{}, err
	}
	defer db.exit()
	now := db.now()
	db.warnAhead(now)
	res, err := db.sweeper.Sweep(ctx, now.UnixNano(), nil)
	return idem.SweepResult(res), err
}

// Compact sweeps every expired record and then compacts the whole store,
// so that the space they held leaves the disk now instead of when
// Options.CompactBytes is reached. progress, when not nil, is called after
// each step. It is for tools (idem compact); a running service leaves the
// work to the background loop.
func (db *Store) Compact(ctx context.Context, progress func(idem.CompactProgress)) (idem.SweepResult, error) {
	if err := db.enter(); err != nil {
		return idem.SweepResult{}, err
	}
	defer db.exit()
	report := func(phase string, done, total int64) {
		if progress != nil {
			progress(idem.CompactProgress{Phase: phase, Done: done, Total: total})
		}
	}
	now := db.now()
	total, err := db.rows.CountExpired(now)
	if err != nil {
		return idem.SweepResult{}, err
	}
	report("sweep", 0, total)
	res, err := db.sweeper.Sweep(ctx, now.UnixNano(), func(walked int) {
		// The background loop may have swept some of them already, and
		// nothing else can join a span that ends at now.
		report("sweep", int64(walked), max(total, int64(walked)))
	})
	if err != nil {
		return idem.SweepResult(res), err
	}
	n, err := db.sweeper.CompactAll(ctx, func(done, total int) { report("compact", int64(done), int64(total)) })
	res.Compactions += n
	return idem.SweepResult(res), err
}

// expireLocked is the sweeper's Expire hook: it re-reads the record under
// its stripe, since a claim may have replaced it since the index was read.
func (db *Store) expireLocked(b *pebble.Batch, rk []byte, now int64) (int64, func(), error) {
	rec, live, err := db.rows.ReadLocked(rk, time.Unix(0, now))
	if err != nil || rec == nil || live {
		return 0, nil, err
	}
	if err := db.rows.ExpireLocked(b, rk, rec); err != nil {
		return 0, nil, err
	}
	done := func() {
		rec.Scope.Tenant, rec.Scope.Endpoint, rec.Scope.Key, _ = keys.ParseRecord(rk)
		db.note(idem.EventSwept, rec.Scope, &rec.Record, time.Time{})
		db.rows.Swept()
	}
	return rec.StoredLen + rec.BodyLen*int64(min(rec.Chunks, 1)), done, nil
}

// background sweeps and reconciles every SweepInterval until Close.
func (db *Store) background() {
	defer db.bg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-db.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(db.opts.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-db.stop:
			return
		case <-t.C:
		}
		if _, err := db.Sweep(ctx); err != nil && ctx.Err() == nil {
			db.opts.Logger.Warn("idem: sweep failed", "err", err)
		}
		if _, err := db.Reconcile(ctx); err != nil && ctx.Err() == nil {
			db.opts.Logger.Warn("idem: reconciliation failed", "err", err)
		}
	}
}

// now reads the clock as records store time: wall-clock nanoseconds in the
// local zone, without a monotonic reading, so that a record read back
// compares equal to the one that was written.
func (db *Store) now() time.Time { return time.Unix(0, db.opts.Now().UnixNano()) }
